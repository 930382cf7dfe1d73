//! Accuracy against published nccl-tests tables (validate/reference/): the healthy datasets
//! a shipped topology describes are held to error bounds, and to beating NCCL's own cost
//! model on the same points.

use std::path::Path;

use fabricsim::calibrate::reference::{load_manifest, reference_dir, score, Score};
use fabricsim::scenario::bench::Fidelity;

fn scores(asserted_only: bool) -> Vec<Score> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let datasets = load_manifest(&reference_dir(root)).expect("manifest loads");
    datasets
        .iter()
        .filter(|d| d.asserted || !asserted_only)
        .filter_map(|d| score(root, d, Fidelity::Event, None).unwrap_or_else(|e| panic!("{}: {e}", d.file)))
        .collect()
}

#[test]
fn asserted_datasets_are_within_bounds_and_beat_nccls_model() {
    let scores = scores(true);
    assert!(scores.len() >= 8, "expected the 8 asserted datasets, got {}", scores.len());
    let mut ours = 0.0;
    let mut nccl = 0.0;
    for s in &scores {
        let tag = &s.file;
        assert!(s.points.len() >= 5, "{tag}: only {} points matched", s.points.len());
        // Bandwidth-bound sizes: within 10% in the median.
        assert!(s.median_large <= 0.10, "{tag}: median error >= 1 MiB {:.1}%", s.median_large * 100.0);
        // Every size, latency-bound ones included: within 15% in the median.
        assert!(s.median_all <= 0.15, "{tag}: median error {:.1}%", s.median_all * 100.0);
        // No point more than 3x off.
        let w = s.worst.as_ref().unwrap();
        assert!(w.error.abs() < 3.0, "{tag}: {} B off by {:.0}%", w.size_bytes, w.error * 100.0);
        let (nl, na) = (s.nccl_median_large.unwrap(), s.nccl_median_all.unwrap());
        // Never clearly worse than NCCL's model where it is good (large messages on one
        // node: both within a few %), and better over all sizes.
        assert!(
            s.median_large <= nl + 0.01,
            "{tag}: {:.1}% vs NCCL model {:.1}%",
            s.median_large * 100.0,
            nl * 100.0
        );
        assert!(s.median_all <= na, "{tag}: {:.1}% vs NCCL model {:.1}%", s.median_all * 100.0, na * 100.0);
        ours += s.median_all;
        nccl += na;
    }
    // Overall, at least 5x closer than NCCL's model across all sizes.
    assert!(
        ours * 5.0 < nccl,
        "mean median error {:.1}% vs NCCL model {:.1}%",
        ours * 100.0 / scores.len() as f64,
        nccl * 100.0 / scores.len() as f64
    );
}

#[test]
fn every_dataset_scores_and_unasserted_ones_say_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let datasets = load_manifest(&reference_dir(root)).unwrap();
    for d in &datasets {
        assert!(root.join("validate/reference").join(&d.file).is_file(), "{} missing", d.file);
        if !d.asserted {
            assert!(
                d.reason.as_deref().is_some_and(|r| !r.is_empty()),
                "{}: unasserted without a reason",
                d.file
            );
        }
    }
    // The caveat datasets still run; the ones a shipped topology describes closely stay
    // within 15% at large sizes (regression guard, not a claim).
    for s in scores(false).iter().filter(|s| !s.asserted) {
        assert!(!s.points.is_empty(), "{}: no points", s.file);
        if !s.file.contains("a3ultra") && !s.file.contains("sharp") {
            assert!(s.median_large <= 0.15, "{}: {:.1}%", s.file, s.median_large * 100.0);
        }
    }
}
