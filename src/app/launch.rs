//! The launch check: every rank of a job must run the same command line of the same
//! binary. Ranks started with different arguments (mpirun's MPMD syntax,
//! `mpirun -np 1 torusrec als --dim 8 : -np 1 torusrec als --dim 16`, or a launcher
//! script that builds the line per rank) would validate different configs and then
//! meet in collectives of different sizes: an MPI truncation abort, or a hang.
//!
//! So `main`, right after MPI starts and before any other collective, all-gathers one
//! u64 per rank, [`launch_hash`] of its arguments and binary, and [`check_same_launch`]
//! decodes the gathered hashes identically on every rank: all equal, or every rank
//! stops with exit 2, the message naming the groups of ranks that agree. One fixed-size
//! all-gather cannot itself be mismatched, whatever the arguments.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;

/// What identifies this binary: the package version and the executable's size in
/// bytes (a stand-in for a build id that costs one `stat`: two builds of one version
/// almost always differ in size; 0 when the executable cannot be found).
pub fn binary_identity() -> String {
    let size = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| m.len())
        .unwrap_or(0);
    format!("torusrec {} ({size} bytes)", env!("CARGO_PKG_VERSION"))
}

/// A 64-bit hash (FNV-1a) of `binary` and the arguments `args` (without the program
/// name, which may legitimately differ: a relative and an absolute path to one file).
/// Each item is length-prefixed, so `["a b"]` and `["a", "b"]` differ.
pub fn launch_hash(binary: &str, args: &[OsString]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for &b in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(binary.as_bytes());
    for a in args {
        eat(a.as_bytes());
    }
    h
}

/// `0-3,5,7-8`: a sorted list of ranks with runs collapsed.
fn rank_list(ranks: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Pure decode of the gathered hashes (`hashes[r]` is rank `r`'s [`launch_hash`]),
/// identical on every rank: `Ok` when all are equal, else a usage error (exit 2)
/// naming the groups of ranks that run the same command line, rank 0's group first.
pub fn check_same_launch(hashes: &[u64]) -> Result<()> {
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (r, &h) in hashes.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == h) {
            Some((_, ranks)) => ranks.push(r),
            None => groups.push((h, vec![r])),
        }
    }
    if groups.len() <= 1 {
        return Ok(());
    }
    let list = groups
        .iter()
        .map(|(_, ranks)| {
            let s = if ranks.len() == 1 { "" } else { "s" };
            format!("rank{s} {}", rank_list(ranks))
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(Error::Config(format!(
        "the ranks were started with {} different command lines or binaries ({list}): every rank must run the same torusrec with the same arguments",
        groups.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn hash_separates_arguments_and_binaries() {
        let b = "torusrec 0.1.0 (100 bytes)";
        let base = launch_hash(b, &args(&["als", "--dim", "8"]));
        assert_eq!(base, launch_hash(b, &args(&["als", "--dim", "8"])));
        assert_ne!(base, launch_hash(b, &args(&["als", "--dim", "16"])));
        assert_ne!(base, launch_hash(b, &args(&["als", "--dim"])));
        assert_ne!(
            base,
            launch_hash("torusrec 0.1.0 (101 bytes)", &args(&["als", "--dim", "8"]))
        );
        // Boundaries between arguments count.
        assert_ne!(
            launch_hash(b, &args(&["a b"])),
            launch_hash(b, &args(&["a", "b"]))
        );
        assert_ne!(
            launch_hash(b, &args(&["ab", ""])),
            launch_hash(b, &args(&["a", "b"]))
        );
    }

    #[test]
    fn equal_hashes_pass_and_groups_are_named() {
        assert!(check_same_launch(&[]).is_ok());
        assert!(check_same_launch(&[7]).is_ok());
        assert!(check_same_launch(&[7; 5]).is_ok());
        let e = check_same_launch(&[7, 9]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let m = e.to_string();
        assert!(m.contains("2 different command lines"), "{m}");
        assert!(m.contains("(rank 0; rank 1)"), "{m}");
        let m = check_same_launch(&[1, 1, 2, 1, 3, 2, 2, 1, 1])
            .unwrap_err()
            .to_string();
        assert!(m.contains("(ranks 0-1,3,7-8; ranks 2,5-6; rank 4)"), "{m}");
        assert!(m.contains("3 different"), "{m}");
    }
}
