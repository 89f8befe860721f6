//! How much memory one rank of the embedding model needs, estimated before anything
//! large is allocated, and the check against the node's memory divided by the ranks on
//! it. Pure arithmetic besides reading the node's memory size.

use crate::embed::dense::arch::DenseShape;
use crate::embed::dense::mlp::DenseOpt;
use crate::mem_estimate::{self as memory, MemEstimate};
use crate::metrics::human_bytes;
use crate::node;
use crate::spec::ModelSpec;
use crate::{Error, Result};

/// An upper bound of what one embed rank holds: `tables` bytes of its table shards
/// with their optimizer state, the MLP (weights, gradient, accumulated gradient,
/// optimizer state), a micro-batch's activations (forward values, pre-activations
/// and gradients of every layer), for the whole step of `accumulate` micro-batches
/// (one lookup covers it) the MLP's input and its gradient, the lookups (ids and
/// looked-up rows, sent and received: as if one rank served a whole micro-batch, or
/// the rank's own examples of the step when they are more), and the `preloaded`
/// examples this rank holds with `--preload` (ids, offsets, dense features and label
/// each). Pure arithmetic.
pub fn estimate(
    spec: &ModelSpec,
    micro: usize,
    accumulate: usize,
    ranks: usize,
    dense: &DenseOpt,
    tables: u64,
    preloaded: u64,
) -> MemEstimate {
    let f = 4.0f64;
    // The architecture's parameters and activations (DLRM's two MLPs and its
    // interaction, DCN-v2's cross layers); a spec the dense model refuses is refused
    // before this estimate, so the plain MLP's count only stands in for the message.
    let shape = DenseShape::of(spec).unwrap_or_else(|_| {
        let layers = spec.mlp_layers();
        DenseShape {
            gemms: layers.windows(2).map(|w| (w[0], w[1])).collect(),
            params: layers.windows(2).map(|w| (w[0] + 1) * w[1]).sum(),
            activations: layers.iter().sum(),
        }
    });
    let params = shape.params as f64;
    // Optimizer floats per parameter (Adagrad 1, Adam 2).
    let state = dense.state_len(1) as f64;
    let per_rank = micro.div_ceil(ranks.max(1)) as f64;
    let step_per_rank = per_rank * accumulate as f64;
    let micro_or_step = (micro as f64).max(step_per_rank);
    let width = shape.activations as f64;
    let ids: f64 = spec.tables.iter().map(|t| t.valency).sum();
    let row_floats: f64 = spec.tables.iter().map(|t| t.valency * t.dim as f64).sum();
    let b = |x: f64| {
        if x >= u64::MAX as f64 {
            u64::MAX
        } else {
            x as u64
        }
    };
    MemEstimate {
        parts: vec![
            ("tables", tables),
            ("MLP", b(params * f * (3.0 + state))),
            ("activations", b(per_rank * width * f * 3.0)),
            (
                "step inputs",
                b(step_per_rank * spec.mlp_input() as f64 * f * 2.0),
            ),
            // One micro-batch served by this rank alone (a hot table on one rank), or
            // this rank's own examples of the whole step, whichever is more.
            ("lookups", b(micro_or_step * (ids + row_floats) * f * 2.0)),
            (
                "preloaded examples",
                b(preloaded as f64
                    * (ids + spec.tables.len() as f64 + spec.n_dense as f64 + 1.0)
                    * f),
            ),
            ("base", memory::BASE_BYTES),
        ],
    }
}

/// Refuse (exit 2) a model and batch whose [`estimate`] exceeds the node's
/// memory divided by the ranks on it (`--mem-per-rank` bounds the tables alone).
pub fn check(
    spec: &ModelSpec,
    micro: usize,
    accumulate: usize,
    ranks: usize,
    dense: &DenseOpt,
    tables: u64,
    preloaded: u64,
) -> Result<()> {
    let est = estimate(spec, micro, accumulate, ranks, dense, tables, preloaded);
    check_within(&est, node::mem_limit(None))
}

/// [`check`]'s refusal of `est` against `limit` bytes per rank.
fn check_within(est: &MemEstimate, limit: Option<u64>) -> Result<()> {
    node::check_fits(est.total(), limit, |limit| {
        format!(
            "this model and step need an estimated {} per rank, more than {} (the node's memory divided by the {} rank(s) on it); use a smaller --batch or --accumulate, fewer --steps with --preload, smaller tables or hidden layers, or more ranks",
            est.describe(),
            human_bytes(limit),
            node::ranks_on_node()
        )
    })
    .map_err(Error::Config)
}

/// The most table bytes (rows and optimizer state) one rank may hold so that [`check`]
/// admits the run: the node's memory divided by the ranks on it, less everything else
/// [`estimate`] counts, none when the node's memory is unknown. The planner's bound
/// when `--mem-per-rank` is not given, so that `--plan auto` makes a plan `embed`
/// accepts.
pub fn table_budget(
    spec: &ModelSpec,
    micro: usize,
    accumulate: usize,
    ranks: usize,
    dense: &DenseOpt,
    preloaded: u64,
) -> Option<u64> {
    let rest = estimate(spec, micro, accumulate, ranks, dense, 0, preloaded);
    budget_within(&rest, node::mem_limit(None))
}

/// [`table_budget`] against `limit` bytes per rank, from the estimate without tables.
fn budget_within(rest: &MemEstimate, limit: Option<u64>) -> Option<u64> {
    limit.map(|l| l.saturating_sub(rest.total()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::preset;

    #[test]
    fn adam_holds_one_more_float_per_mlp_parameter_than_adagrad() {
        let spec = preset("tiny", 1.0).unwrap();
        let mlp = |opt: &DenseOpt| {
            estimate(&spec, 64, 1, 2, opt, 0, 0)
                .parts
                .iter()
                .find(|p| p.0 == "MLP")
                .unwrap()
                .1
        };
        let params: u64 = spec
            .mlp_layers()
            .windows(2)
            .map(|w| (w[0] as u64 + 1) * w[1] as u64)
            .sum();
        assert!(params > 0);
        assert_eq!(
            mlp(&DenseOpt::adam(0.01)) - mlp(&DenseOpt::adagrad(0.01)),
            params * 4
        );
        assert_eq!(mlp(&DenseOpt::adagrad(0.01)), params * 4 * 4);
    }

    #[test]
    fn the_mlp_part_counts_the_architectures_parameters() {
        use crate::embed::dense::arch::DenseModel;
        use crate::spec::{ArchKind, ArchSpec};
        let mut spec = preset("tiny", 1.0).unwrap();
        for kind in [ArchKind::Mlp, ArchKind::Dlrm, ArchKind::Dcnv2] {
            *spec.arch = ArchSpec {
                kind,
                ..Default::default()
            };
            if kind == ArchKind::Dlrm {
                let d = spec.tables[0].dim;
                spec.tables.iter_mut().for_each(|t| t.dim = d);
                spec.arch.bottom_mlp = Some(vec![8, d]);
                spec.arch.top_mlp = Some(vec![16, 8]);
            }
            let n = DenseModel::new(&spec, 1).unwrap().n_params() as u64;
            let sh = DenseShape::of(&spec).unwrap();
            assert_eq!(sh.params as u64, n, "{kind:?}");
            let mlp = estimate(&spec, 64, 1, 2, &DenseOpt::adagrad(0.01), 0, 0)
                .parts
                .iter()
                .find(|p| p.0 == "MLP")
                .unwrap()
                .1;
            assert_eq!(mlp, n * 4 * 4, "{kind:?}");
        }
    }

    #[test]
    fn accumulation_scales_what_one_lookup_holds_for_the_step() {
        let spec = preset("tiny", 1.0).unwrap();
        let part = |k: usize, name: &str| {
            estimate(&spec, 64, k, 2, &DenseOpt::adagrad(0.01), 0, 0)
                .parts
                .iter()
                .find(|p| p.0 == name)
                .unwrap()
                .1
        };
        assert!(part(1, "lookups") > 0 && part(1, "step inputs") > 0);
        // 64 examples a micro-batch over 2 ranks: from K = 2 on, a rank's own step
        // holds more than one micro-batch.
        assert_eq!(part(2, "lookups"), part(1, "lookups"));
        assert_eq!(part(6, "lookups"), 3 * part(1, "lookups"));
        assert_eq!(part(5, "step inputs"), 5 * part(1, "step inputs"));
        assert_eq!(part(5, "activations"), part(1, "activations"));
    }

    #[test]
    fn the_table_budget_is_the_most_tables_the_check_admits() {
        let spec = preset("tiny", 1.0).unwrap();
        let dense = DenseOpt::adam(0.01);
        let est = |tables| estimate(&spec, 4096, 3, 4, &dense, tables, 1000);
        let rest = est(0).total();
        assert!(rest > memory::BASE_BYTES);
        let limit = rest + (300 << 20);
        let budget = budget_within(&est(0), Some(limit)).unwrap();
        assert_eq!(budget, 300 << 20);
        assert!(check_within(&est(budget), Some(limit)).is_ok());
        let refused = check_within(&est(budget + 1), Some(limit)).unwrap_err();
        assert!(
            refused.to_string().contains("need an estimated"),
            "{refused}"
        );
        // Nothing left for the tables when the rest alone does not fit; no bound when
        // the node's memory is unknown.
        assert_eq!(budget_within(&est(0), Some(rest / 2)), Some(0));
        assert_eq!(budget_within(&est(0), None), None);
    }
}
