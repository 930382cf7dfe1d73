//! Accuracy against published nccl-tests tables (validate/reference/): the healthy datasets
//! a shipped topology describes are held to error bounds, and to beating NCCL's own cost
//! model on the same points.

use std::path::Path;

use std::sync::OnceLock;

use fabricsim::calibrate::reference::{
    band_score, cluster_scores, load_manifest, median, reference_dir, score_upto, Dataset, Score,
};
use fabricsim::scenario::bench::Fidelity;

/// Every dataset's score, computed once for all the tests of this module (the 10-node
/// tables are the slowest part of the suite).
fn all_scores() -> &'static [(Dataset, Score)] {
    static ALL: OnceLock<Vec<(Dataset, Score)>> = OnceLock::new();
    ALL.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let datasets = load_manifest(&reference_dir(root)).expect("manifest loads");
        datasets
            .into_iter()
            .filter_map(|d| {
                // The 80-GPU all-to-all goes to 16 GiB; its sizes above 1 GiB add minutes to
                // the suite and nothing the smaller sizes do not test (`validate` scores them).
                let big = d.nodes.unwrap_or(1) * d.gpus.unwrap_or(8) >= 64;
                let cap = (big && d.collective.as_deref() == Some("alltoall")).then_some(1 << 30);
                let s = score_upto(root, &d, Fidelity::Event, None, cap)
                    .unwrap_or_else(|e| panic!("{}: {e}", d.file));
                s.map(|s| (d, s))
            })
            .collect()
    })
}

fn scores(asserted_only: bool) -> Vec<Score> {
    all_scores().iter().filter(|(d, _)| d.asserted || !asserted_only).map(|(_, s)| s.clone()).collect()
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
        // All-to-all and send/recv have no NCCL model to compare with.
        let (Some(nl), Some(na)) = (s.nccl_median_large, s.nccl_median_all) else { continue };
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
        "sum of median errors {:.1}% vs NCCL model {:.1}%",
        ours * 100.0,
        nccl * 100.0
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
        // Exempt, each with its reason in the manifest: the a3ultra pair and SHARP on A100
        // (as before), and the OCI RoCE example (16.8% since Ampere's refit, see its reason).
        // No longer exempt: the 10-node all-gather and reduce-scatter (11.3% / 11.4% since a
        // lockstep ring's network step crosses at each channel's share of its NIC). The
        // 10-node H100 and 32-node B200
        // send/recv are no longer exempt: one p2p channel drives NCCL's 14 GB/s over the
        // network; nor the 10-node all-reduce (13.5% -> 5.8% with NCCL's NVLS-Tree cap); nor
        // the 8-node B200 send/recv (46.7% -> 5.8% with NCCL 2.29's channels per peer).
        let exempt = ["a3ultra", "sharp", "oci"];
        if !exempt.iter().any(|e| s.file.contains(e)) {
            assert!(s.median_large <= 0.15, "{}: {:.1}%", s.file, s.median_large * 100.0);
        }
    }
}

fn one(file: &str) -> Score {
    all_scores()
        .iter()
        .find(|(d, _)| d.file == file)
        .map(|(_, s)| s.clone())
        .unwrap_or_else(|| panic!("{file} not in the manifest or not scored"))
}

/// The smallest size from which `a` stays above `b` (busbw by size, same sizes).
fn crossover(a: &[(u64, f64)], b: &[(u64, f64)]) -> Option<u64> {
    let mut cross = None;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.0, y.0);
        match (x.1 > y.1, cross) {
            (true, None) => cross = Some(x.0),
            (false, _) => cross = None,
            _ => {}
        }
    }
    cross
}

/// The smallest size whose busbw reaches half of the largest.
fn knee(v: &[(u64, f64)]) -> u64 {
    let peak = v.iter().map(|x| x.1).fold(0.0, f64::max);
    v.iter().find(|x| x.1 >= peak / 2.0).unwrap().0
}

#[test]
fn the_shape_is_right_floor_knee_plateau_and_the_nvls_ring_crossover() {
    // One H100 node, one cluster, one NCCL version: ring and NVLS forced.
    let ring = one("h100sxm-together-1node-8gpu-allreduce-ring-nccl2.26.2.csv");
    let nvls = one("h100sxm-together-1node-8gpu-allreduce-nvls-nccl2.26.2.csv");
    let series = |s: &Score, measured: bool| -> Vec<(u64, f64)> {
        s.points.iter().map(|p| (p.size_bytes, if measured { p.measured } else { p.simulated })).collect()
    };
    let common = |a: Vec<(u64, f64)>, b: &[(u64, f64)]| -> Vec<(u64, f64)> {
        a.into_iter().filter(|x| b.iter().any(|y| y.0 == x.0)).collect()
    };
    let (mr, mn) = (series(&ring, true), series(&nvls, true));
    let (sr, sn) = (series(&ring, false), series(&nvls, false));
    let (mr, mn) = (common(mr, &mn), common(mn, &series(&ring, true)));
    let (sr, sn) = (common(sr, &sn), common(sn, &series(&ring, false)));
    // Where NVLS overtakes ring for good: the same size, or one step (x2) either way.
    // (Measured, the two curves stay within 5% of each other from 1 to 16 MiB.)
    let (m, s) =
        (crossover(&mn, &mr).expect("measured crossover"), crossover(&sn, &sr).expect("simulated crossover"));
    assert!(s * 2 >= m && s <= m * 2, "NVLS overtakes ring at {m} B measured, {s} B simulated");
    for (a, b) in sn.iter().zip(&sr).filter(|x| x.0 .0 >= 32 << 20) {
        assert!(a.1 > b.1 * 1.05, "{} B: NVLS {:.1} vs ring {:.1} GB/s", a.0, a.1, b.1);
    }
    for (name, sc) in [("ring", &ring), ("nvls", &nvls)] {
        let (meas, sim) = (series(sc, true), series(sc, false));
        // The knee (half the plateau) at the same size or one step away.
        let (km, ks) = (knee(&meas), knee(&sim));
        assert!(ks * 2 >= km && ks <= km * 2, "{name}: knee at {km} B measured, {ks} B simulated");
        // The latency floor: the smallest sizes' times within 20% (ring all-reduce is 15%
        // slow there: the -g 8 launch stagger is charged in full before its 14 steps).
        for p in sc.points.iter().take(4) {
            assert!(p.error.abs() <= 0.20, "{name}: {} B off by {:.1}%", p.size_bytes, p.error * 100.0);
        }
        // The plateau: the largest size within 5%.
        let last = sc.points.last().unwrap();
        assert!(last.error.abs() <= 0.05, "{name}: plateau off by {:.1}%", last.error * 100.0);
    }
}

#[test]
fn tree_beats_ring_across_nodes_until_the_bandwidth_bound_sizes() {
    // 16 DGX H100 nodes: the double binary tree's log-depth latency wins at mid sizes, the
    // ring's full NIC bandwidth wins at large ones (NCCL's tuner switches the same way).
    use fabricsim::collective::Algo;
    use fabricsim::fabric::build::{build, BuildOpts};
    use fabricsim::scenario::bench::{run_bench, BenchConfig};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = fabricsim::fabric::load_topology(&root.join("topologies/superpod-h100.toml")).unwrap();
    let f = build(&spec, &BuildOpts { nodes: Some(16), ..Default::default() }).unwrap();
    let sizes = vec![1 << 20, 4 << 20, 16 << 20, 1 << 30, 2 << 30];
    let busbw = |algo, sizes: &[u64]| -> Vec<f64> {
        let cfg = BenchConfig { sizes: sizes.to_vec(), algo: Some(algo), ..Default::default() };
        run_bench(&f, &cfg).unwrap().iter().map(|r| r.busbw_gbps).collect()
    };
    let (ring, tree) = (busbw(Algo::Ring, &sizes), busbw(Algo::Tree, &sizes[..4]));
    for i in 0..3 {
        assert!(tree[i] > 1.2 * ring[i], "{} B: tree {:.1} vs ring {:.1} GB/s", sizes[i], tree[i], ring[i]);
    }
    // 1.19x since a step's network message crosses at each channel's share of its NIC.
    assert!(ring[3] > 1.1 * tree[3], "1 GiB: ring {:.1} vs tree {:.1} GB/s", ring[3], tree[3]);
    // And the ring's plateau is the NICs': 8 x 400G per node at the network efficiency. At
    // 1 GiB (one loop of 512 KiB chunks on 128 ranks) the ring is still paced by its network
    // messages' store-and-forward (as the 10-node table measures at 1 GiB); from 2 GiB on,
    // by the NICs.
    assert!((330.0..380.0).contains(&ring[4]), "ring at 2 GiB: {:.1} GB/s", ring[4]);
    assert!(ring[3] < ring[4], "ring at 1 GiB {:.1} GB/s, at 2 GiB {:.1}", ring[3], ring[4]);
}

/// Median |error| over tables, of each table's median |error| (>= 1 MiB, all sizes).
fn medians(tables: &[&Score]) -> (f64, f64) {
    (
        median(tables.iter().map(|s| s.median_large).collect()),
        median(tables.iter().map(|s| s.median_all).collect()),
    )
}

#[test]
fn healthy_and_multi_node_tables_meet_the_issue_medians() {
    let asserted: Vec<&(Dataset, Score)> = all_scores().iter().filter(|(d, _)| d.asserted).collect();
    let all: Vec<&Score> = asserted.iter().map(|(_, s)| s).collect();
    let multi: Vec<&Score> = asserted.iter().filter(|(d, _)| d.multi_node()).map(|(_, s)| s).collect();
    assert!(multi.len() >= 4, "expected at least 4 asserted multi-node tables, got {}", multi.len());
    // Issue 10's targets are 6% (>= 1 MiB) and 10% (all sizes), over all healthy tables and
    // over the multi-node ones alone; these bounds are what is achieved (3.8% / 4.1% and
    // 5.3% / 5.9% when written), with a little room. 4.5% -> 5% at >= 1 MiB (4.7% achieved)
    // since Ampere's LL128 NVLink step is NCCL's 1.9 us instead of a fitted 6.71 us: the
    // held-out A100 clusters gain (OCI 16.8% -> 9.7% with Hopper's launch, the held-out
    // clusters' median 10.9% -> 8.2%) and the asserted Azure A100 table, whose mid sizes are
    // slower than the other one-node A100 table's, loses (3.4% -> 6.8%; docs/PARAMETERS.md).
    let (large, every) = medians(&all);
    assert!(large <= 0.05, "healthy tables: median {:.1}% at >= 1 MiB", large * 100.0);
    assert!(every <= 0.05, "healthy tables: median {:.1}% over all sizes", every * 100.0);
    let (large, every) = medians(&multi);
    assert!(large <= 0.06, "multi-node tables: median {:.1}% at >= 1 MiB", large * 100.0);
    // 7% (was 8%): the 8- and 32-node B200 send/recv tables joined the asserted multi-node
    // set with NCCL 2.29's channels per peer (6.5% over the seven when written; the issue's
    // target is 10%).
    assert!(every <= 0.07, "multi-node tables: median {:.1}% over all sizes", every * 100.0);
    for s in &all {
        assert!(s.median_large <= 0.15, "{}: {:.1}% at >= 1 MiB", s.file, s.median_large * 100.0);
    }
    // Every healthy multi-node table, asserted or not (the 10-node ring all-gather and
    // reduce-scatter included): the issue's targets themselves. 5.9% and 6.9% when written
    // (7.4% and 8.1% before NCCL 2.29's p2p channels per peer and the p2p step rate).
    let healthy: Vec<&Score> = all_scores()
        .iter()
        .filter(|(d, _)| d.quality == "healthy" && d.multi_node())
        .map(|(_, s)| s)
        .collect();
    assert!(healthy.len() >= 10, "healthy multi-node tables: {}", healthy.len());
    // Issue 10: no healthy table above 15% at >= 1 MiB (the 10-node reduce-scatter was the
    // last, 16.1%, until a lockstep step crossed at each channel's share of its NIC).
    for (d, s) in all_scores().iter().filter(|(d, _)| d.quality == "healthy") {
        assert!(s.median_large <= 0.15, "{}: {:.1}% at >= 1 MiB", d.file, s.median_large * 100.0);
    }
    let (large, every) = medians(&healthy);
    assert!(large <= 0.06, "healthy multi-node tables: median {:.1}% at >= 1 MiB", large * 100.0);
    assert!(every <= 0.10, "healthy multi-node tables: median {:.1}% over all sizes", every * 100.0);
}

#[test]
fn across_nodes_beats_nccls_model_in_every_size_band() {
    // Every multi-node table NCCL's model covers (healthy and caveat), pooled by size band
    // (the figures `validate` prints under "by regime and size band").
    let pairs: Vec<(&Dataset, &Score)> = all_scores().iter().map(|(d, s)| (d, s)).collect();
    let band = |lo: u64, hi: u64| -> (f64, f64, usize) {
        let b = band_score(&pairs, true, lo, hi);
        (b.ours_covered, b.nccl, b.covered)
    };
    let (o, n, k) = band(0, 1 << 20);
    assert!(k >= 50 && o < n, "below 1 MiB ({k} points): {:.1}% vs NCCL model {:.1}%", o * 100.0, n * 100.0);
    let (o, n, k) = band(64 << 20, u64::MAX);
    assert!(k >= 50 && o < n, "from 64 MiB ({k} points): {:.1}% vs NCCL model {:.1}%", o * 100.0, n * 100.0);
    // 1-64 MiB is the band issue 10 is about: 47.9% against NCCL's 41.8% before multi-node
    // rings moved in lockstep and NVLS-Tree took NCCL's per-channel cap, 29.0% when written.
    // Clearly better than NCCL's model (by 8 points at least), and held near what it is.
    let (o, n, k) = band(1 << 20, 64 << 20);
    assert!(k >= 30, "1-64 MiB: {k} points");
    assert!(o <= 0.32 && o + 0.08 <= n, "1-64 MiB: {:.1}% vs NCCL model {:.1}%", o * 100.0, n * 100.0);
}

#[test]
fn a_multi_node_ring_moves_at_its_network_steps_pace() {
    // 80 H100 across 10 nodes, ring all-gather and reduce-scatter on LL128 at 32-128 MiB:
    // one loop, 79 dependent steps of 26-105 KB per channel. Measured ~8 us a step where the
    // NVLink steps alone would take ~3 us: each step lasts as long as the ring's network step
    // (NCCL's model: intraLat = max(intraLat, netOverhead) on multi-node rings). Before the
    // lockstep the model was +113% to +154% at these sizes; NCCL's model is +33% to +133%.
    // When written: all-gather +29%, +26%, +20%; reduce-scatter +29%, +50%, +50% (its
    // reduction at 64-128 MiB is another matter), each below NCCL's model.
    for (file, bound) in [
        ("h100sxm-xxrjun-cl01-10node-80gpu-allgather-nccl2.29.2.csv", 0.32),
        ("h100sxm-xxrjun-cl01-10node-80gpu-reducescatter-nccl2.29.2.csv", 0.55),
    ] {
        let s = one(file);
        for p in s.points.iter().filter(|p| p.size_bytes <= 128 << 20) {
            assert!(p.error.abs() <= bound, "{file} {} B: {:+.1}%", p.size_bytes, p.error * 100.0);
            let nccl = p.nccl_error.expect("NCCL's model covers a ring");
            assert!(
                p.error.abs() < nccl.abs(),
                "{file} {} B: {:+.1}% vs NCCL {:+.1}%",
                p.size_bytes,
                p.error * 100.0,
                nccl * 100.0
            );
        }
    }
}

#[test]
fn nvls_tree_across_nodes_plateaus_at_nccls_per_channel_cap() {
    // Two Dell XE9680 (8 H100, 8 x 400G) nodes, NVLS-Tree from 2 MiB: the measured plateau
    // (461-469 GB/s from 2 GiB) is NCCL's cap, 8 NVLS channels x perChMaxNVLSTreeBw 57.7 GB/s
    // = 461.6. The event simulator applies the cap to every inter-node connection: it ends
    // within 3% (was +5% to +7% above the measurement, the NVLink/NIC limits alone).
    let s = one("h100sxm-xe9680-2node-16gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.csv");
    for p in s.points.iter().filter(|p| p.size_bytes >= 1 << 30) {
        assert!(p.simulated <= 461.6 * 1.001, "{} B: {:.1} GB/s above NCCL's cap", p.size_bytes, p.simulated);
        assert!(p.error.abs() <= 0.03, "{} B: {:+.1}%", p.size_bytes, p.error * 100.0);
    }
    // Four and ten nodes (perChMaxNVLSTreeBw 45.5): the NVLS-Tree sizes within 12% from
    // 128 MiB (the 4-node table was +10% to +18% there, the 10-node +14% to +41%).
    for file in [
        "h100sxm-vmware-4node-32gpu-ib8x400g-allreduce-default-nccl2.26.2-issue309.csv",
        "h100sxm-xxrjun-cl01-10node-80gpu-allreduce-nccl2.29.2.csv",
    ] {
        for p in
            one(file).points.iter().filter(|p| p.size_bytes >= 128 << 20 && p.choice.contains("NVLSTree"))
        {
            assert!(p.error.abs() <= 0.12, "{file} {} B: {:+.1}%", p.size_bytes, p.error * 100.0);
        }
    }
}

#[test]
fn point_to_point_follows_nccls_channels_and_round_order() {
    let sr1 = one("h100sxm-xxrjun-cl01-1node-8gpu-sendrecv-nccl2.29.2.csv");
    // One node: an operation runs on 4, then 8, 16 and 32 channels as it grows (NCCL's
    // per-peer channel rule, with no cap by the rank count since NCCL 2.19): every size
    // within 7%, the median within 3% (10.9% when 16 channels were the most: -11% from
    // 512 MiB).
    for p in &sr1.points {
        assert!(p.error.abs() <= 0.07, "1 node send/recv {} B: {:+.1}%", p.size_bytes, p.error * 100.0);
    }
    assert!(sr1.median_large <= 0.03, "1 node send/recv: {:.1}%", sr1.median_large * 100.0);
    // 80 ranks across 10 nodes: one channel per peer, and one p2p channel drives NCCL's
    // NCCL_P2P_PER_CHANNEL_NET_BW (14 GB/s) over the network. Measured 15.2 GB/s; before the
    // channel rule the model ran every channel to the NIC's 45 GB/s (+195%), before the
    // per-connection rate one channel reached 20 GB/s (+31%).
    let sr10 = one("h100sxm-xxrjun-cl01-10node-80gpu-sendrecv-nccl2.29.2.csv");
    for p in &sr10.points {
        assert!((13.0..=15.0).contains(&p.simulated), "{} B: {:.1} GB/s", p.size_bytes, p.simulated);
    }
    assert!(sr10.median_large <= 0.10, "10-node send/recv: {:.1}%", sr10.median_large * 100.0);
    // B200, 2 nodes: 4 channels per peer reach the NIC.
    let b2 = one("b200-dgxc-2node-16gpu-ib8x400g-sendrecv-ring-busbwonly-nccl2.29.7.csv");
    assert!(b2.median_large <= 0.08, "B200 2-node send/recv: {:.1}%", b2.median_large * 100.0);
    // All-to-all across 2 nodes in NCCL's round order loads every NIC equally (-51% before).
    let a2 = one("h100sxm-xxrjun-cl01-2node-16gpu-alltoall-nccl2.29.2.csv");
    assert!(a2.median_large <= 0.12, "2-node all-to-all: {:.1}%", a2.median_large * 100.0);
}

#[test]
fn send_recv_degrades_with_scale_through_the_channels_per_peer() {
    // B200 ring of send/recv (X2): 42, 26 and 14.5 GB/s at 2, 8 and 32 nodes. NCCL 2.29
    // gives a network peer ceil(50 / 14) = 4 channels and halves them while
    // 4 x ceil(ranks / 8) exceeds the 16 p2p channels: 4 at 16 ranks, 2 at 64, 1 at 256; each
    // carries at most 14 GB/s. 2 nodes follow the NIC, 8 nodes two channels (46.7% when the
    // model gave one, by NCCL 2.18's per-operation cap), 32 nodes one.
    let b2 = one("b200-dgxc-2node-16gpu-ib8x400g-sendrecv-ring-busbwonly-nccl2.29.7.csv");
    let b8 = one("b200-dgxc-8node-64gpu-ib8x400g-sendrecv-ring-busbwonly-nccl2.29.7.csv");
    let b32 = one("b200-dgxc-32node-256gpu-ib8x400g-sendrecv-ring-busbwonly-nccl2.29.7.csv");
    assert!(b8.median_large <= 0.08, "B200 8-node send/recv: {:.1}%", b8.median_large * 100.0);
    assert!(b32.median_large <= 0.06, "B200 32-node send/recv: {:.1}%", b32.median_large * 100.0);
    // All sizes: every size scored against its own row (the 2-16 KiB sizes on 256 ranks
    // once matched the 1 KiB row: 31%, then 9.9%), and a p2p network channel moving its
    // chunk a step, so the 32-512 KiB operations whose chunk NCCL cuts to a quarter or a half
    // move at that share of 14 GB/s (8 nodes 14.2% -> 6.6%, 32 nodes 9.9% -> 3.7%).
    assert!(b8.median_all <= 0.09, "B200 8-node send/recv, all sizes: {:.1}%", b8.median_all * 100.0);
    assert!(b32.median_all <= 0.06, "B200 32-node send/recv, all sizes: {:.1}%", b32.median_all * 100.0);
    let at = |s: &Score, b: u64| s.points.iter().find(|p| p.size_bytes == b).unwrap().simulated;
    let (s2, s8, s32) = (at(&b2, 256 << 20), at(&b8, 256 << 20), at(&b32, 256 << 20));
    assert!(s2 > 1.4 * s8 && s8 > 1.8 * s32, "256 MiB: {s2:.1}, {s8:.1}, {s32:.1} GB/s at 2, 8, 32 nodes");
    assert!((26.0..=28.0).contains(&s8), "8 nodes, 256 MiB: {s8:.1} GB/s (two channels)");
    assert!((13.0..=14.0).contains(&s32), "32 nodes, 256 MiB: {s32:.1} GB/s (one channel)");
}

#[test]
fn one_p2p_network_channel_carries_nccls_per_channel_rate() {
    // Two DGX H100 nodes, a send/recv forced onto one channel per network peer: the NIC could
    // carry 45 GB/s, the channel carries 14 (NCCL_P2P_PER_CHANNEL_NET_BW). Two channels, 28.
    use fabricsim::collective::Collective;
    use fabricsim::fabric::build::{build, BuildOpts};
    use fabricsim::scenario::bench::{run_bench, BenchConfig};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = fabricsim::fabric::load_topology(&root.join("topologies/dgx-h100.toml")).unwrap();
    let f =
        build(&spec, &BuildOpts { nodes: Some(2), gpus_per_node: Some(1), ..Default::default() }).unwrap();
    for (per_peer, lo, hi) in [("1", 13.0, 14.0), ("2", 26.0, 28.0)] {
        let mut cfg =
            BenchConfig { coll: Collective::SendRecv, sizes: vec![256 << 20], ..Default::default() };
        cfg.env.set("NCCL_NCHANNELS_PER_NET_PEER", per_peer, Collective::SendRecv).unwrap();
        let bw = run_bench(&f, &cfg).unwrap()[0].busbw_gbps;
        assert!((lo..=hi).contains(&bw), "{per_peer} channel(s) per peer: {bw:.1} GB/s");
    }
}

#[test]
fn held_out_clusters_are_reported_apart_and_stay_close() {
    // Leave-one-cluster-out: clusters no shipped parameter was chosen with (datasets.toml
    // `tuned`) are scored apart. When written: 10 in-sample clusters at 5.5% (median of the
    // clusters' medians >= 1 MiB), 4 held out at 16.9% (the a3ultra and OCI examples, 46% and
    // 26%, are other fabrics than the topologies describe; the X1 H100 cluster 7.4%, the X2
    // B200 cluster 5.9%).
    let pairs: Vec<(&Dataset, &Score)> = all_scores().iter().map(|(d, s)| (d, s)).collect();
    let cs = cluster_scores(&pairs);
    let held: Vec<_> = cs.iter().filter(|c| !c.tuned).collect();
    assert!(held.len() >= 4, "held-out clusters: {held:?}");
    assert!(cs.iter().filter(|c| c.tuned).count() >= 8, "{cs:?}");
    let m = median(held.iter().map(|c| c.median_large).collect());
    // 20% -> 10% on 2026-12-02 (8.2% achieved, 10.9% before Ampere's LL128 NVLink step
    // became NCCL's 1.9 us instead of a fitted 6.71 us and its launch Hopper's).
    assert!(m <= 0.10, "held-out clusters: median {:.1}%", m * 100.0);
    // The OCI A100 pair's tree LL128 sizes paid the fitted step at each of the ~16 hops of
    // their chains (16.8%); with NCCL's per-hop latency it is within 10% (9.7%; 7.9% since the 2026-12-04 refit of its LL128 channel rate).
    let oci = cs.iter().find(|c| c.cluster == "a100sxm40-oci").expect("OCI A100 cluster");
    assert!(!oci.tuned && oci.median_large <= 0.10, "OCI A100: {:.1}%", oci.median_large * 100.0);
    // The two clusters added with issue 10, whose systems the shipped topologies describe.
    for name in ["h100sxm-xxrjun-cl01", "b200-dgxc"] {
        let c = cs.iter().find(|c| c.cluster == name).unwrap_or_else(|| panic!("{name} missing"));
        assert!(!c.tuned && c.median_large <= 0.10, "{name}: {:.1}%", c.median_large * 100.0);
    }
}

#[test]
fn collnet_climbs_through_the_mid_sizes_as_sharp_measures() {
    // CoreWeave's 4 x 8 A100 with SHARP (CollNet Direct, held out): from 4 to 64 MiB the
    // measured busbw grows by 13-48% per doubling. With NCCL's fixed 512 KiB chunk the
    // simulated curve sat on a plateau there (+8%, +4%, +2% per doubling): each channel
    // and head had under one chunk to pipeline. NCCL halves the chunk until it has
    // (NCCL_FACTS 4.3, collective::collnet::collnet_chunk).
    let s = one("coreweave-a100-4node-32gpu-ib-sharp-collnet-allreduce-nccl2.12.csv");
    let mid: Vec<_> = s.points.iter().filter(|p| (4 << 20..=64 << 20).contains(&p.size_bytes)).collect();
    assert_eq!(mid.len(), 5);
    for w in mid.windows(2) {
        assert!(
            w[1].simulated > 1.10 * w[0].simulated,
            "{} -> {} B: {:.1} -> {:.1} GB/s",
            w[0].size_bytes,
            w[1].size_bytes,
            w[0].simulated,
            w[1].simulated
        );
    }
    // And a SHARP operation's fixed cost (NCCL's 31 us) sets the small CollNet sizes: at
    // 64 KiB to 1 MiB within a factor of 2 of the measurement (1.8-2.2x fast at 3 us).
    for p in s.points.iter().filter(|p| (64 << 10..=1 << 20).contains(&p.size_bytes)) {
        assert!(
            p.simulated < 2.0 * p.measured,
            "{} B: {:.2} vs {:.2} GB/s",
            p.size_bytes,
            p.simulated,
            p.measured
        );
    }
}

#[test]
fn an_nvlink5_node_moves_at_nccls_nvlink_rate() {
    // Blackwell's NVLink efficiency is NCCL's own rate over the link's, 40.1 of 50 GB/s per
    // NVLink 5 link (SM100_NVLINK_BW), as Hopper's 0.82 is its 20.6 of 25. An 8-GPU DGX
    // B300 at 8 GiB against the bus bandwidths a user reported there (NCCL issue #2140;
    // shared/reference/hardware.csv, a check, not an input): ring ~695 GB/s without NVLS,
    // ~845 with. The efficiency fitted on the one GB200 rack table, 0.923, gave 828 and 952
    // (+19%, +13%).
    use fabricsim::collective::Collective;
    use fabricsim::fabric::build::{build, BuildOpts};
    use fabricsim::scenario::bench::{run_bench, BenchConfig};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = fabricsim::fabric::load_topology(&root.join("topologies/dgx-b300.toml")).unwrap();
    let f = build(&spec, &BuildOpts::default()).unwrap();
    for (nvls, reported) in [("0", 695.0), ("1", 845.0)] {
        let mut cfg = BenchConfig { sizes: vec![8 << 30], ..Default::default() };
        cfg.env.set("NCCL_NVLS_ENABLE", nvls, Collective::AllReduce).unwrap();
        let r = &run_bench(&f, &cfg).unwrap()[0];
        let err = r.busbw_gbps / reported - 1.0;
        assert!(
            err.abs() < 0.06,
            "NVLS {nvls}: {:.1} GB/s against {reported} ({:+.1}%)",
            r.busbw_gbps,
            err * 100.0
        );
    }
}
