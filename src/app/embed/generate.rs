//! `torusrec generate clicks`: rank 0 writes a click log of the model's tables.

use super::model::resolve_model;
use crate::app::group;
use crate::cli::GenerateClicksArgs;
use crate::comm::Comm;
use crate::data::clicks::log_file::write_planted_log;
use crate::metrics::human_bytes;
use crate::{Error, Result};

/// Collective: every rank must call. `generate clicks`: rank 0 writes the log.
pub fn global_generate_clicks<C: Comm>(comm: &C, a: &GenerateClicksArgs) -> Result<()> {
    let res = (|| {
        let spec = resolve_model(&a.model)?;
        if let Some(t) = &a.model.tables {
            crate::io::outfile::check_apart(&a.out, &[("--tables", t)])?;
        }
        if a.examples == 0 {
            return Err(Error::Config("--examples must be at least 1".into()));
        }
        if comm.rank() != 0 {
            return Ok(());
        }
        let t = std::time::Instant::now();
        let s = write_planted_log(&a.out, &spec, a.seed, a.planted, a.examples, a.force, 65536)?;
        println!(
            "clicks: {} examples, {} tables, {} ids, {} labels, positive rate {:.4}, {} in {:.1} s -> {}",
            group(s.examples),
            spec.tables.len(),
            group(s.ids_per_table.iter().sum()),
            a.planted.describe(spec.tables.len()),
            s.positive_rate,
            human_bytes(s.bytes),
            t.elapsed().as_secs_f64(),
            a.out.display()
        );
        Ok(())
    })();
    comm.agree(res)
}
