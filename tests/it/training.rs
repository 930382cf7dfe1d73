//! The training layer's foundation: model files, parameter counts against the published
//! ones, plan validation (issue 9's bad-input rules), rank placement, FLOPs, memory, pipeline
//! schedules and the analytical step estimate.

use std::path::{Path, PathBuf};

use fabricsim::workload::model::{load_model, parse_model, Model};
use fabricsim::workload::plan::{
    parse_order, parse_plan, parse_plan_noted, Coord, GroupKind, Overlap, Placement, Plan, Recompute,
    Schedule, Sharding,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn model(name: &str) -> Model {
    load_model(&root().join("models").join(format!("{name}.toml"))).unwrap()
}

fn rel_err(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

#[test]
fn every_shipped_model_loads_and_cites_a_source() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("models")).unwrap() {
        let p = e.unwrap().path();
        let m = load_model(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(Some(m.name.as_str()), p.file_stem().and_then(|s| s.to_str()), "{}", p.display());
        assert!(m.source.len() > 10, "{} cites no source", p.display());
        n += 1;
    }
    assert!(n >= 19, "only {n} model files");
}

#[test]
fn parameter_counts_match_the_published_ones() {
    // (model, published total, published active), as cited in each model file.
    let cases = [
        ("llama3-8b", 8.0e9, None),
        ("llama3-70b", 70.0e9, None),
        ("llama3-405b", 405.0e9, None),
        ("gpt3-175b", 175.0e9, None),
        ("mixtral-8x7b", 46.7e9, Some(12.9e9)),
        ("mixtral-8x22b", 141.0e9, Some(39.0e9)),
        ("nemotron4-340b", 340.0e9, None),
        ("nemotron4-15b", 15.7e9, None),
        ("deepseek-v3", 671.0e9, Some(37.0e9)),
    ];
    for (name, total, active) in cases {
        let m = model(name);
        let p = m.params();
        assert_eq!(m.published_params, Some(total), "{name}: file and test disagree");
        assert!(rel_err(p.total as f64, total) < 0.02, "{name}: {} vs published {total}", p.total);
        if let Some(a) = active {
            assert!(rel_err(p.active as f64, a) < 0.02, "{name}: active {} vs published {a}", p.active);
        } else {
            assert_eq!(p.active, p.total);
        }
    }
    // GPT-3 with Megatron's padded vocabulary is the 174.6B of Narayanan et al. Table 2.
    assert!(rel_err(model("gpt3-175b").params().total as f64, 174.6e9) < 0.001);
}

#[test]
fn megatron_family_matches_narayanan_eq2() {
    // P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), Narayanan et al. SC'21 Eq. (2); ours adds
    // only the final LayerNorm (2h).
    for e in std::fs::read_dir(root().join("models")).unwrap() {
        let p = e.unwrap().path();
        if !p.file_name().unwrap().to_string_lossy().starts_with("megatron-gpt-") {
            continue;
        }
        let m = load_model(&p).unwrap();
        let (l, h, v, s) = (m.layers as f64, m.hidden as f64, m.vocab as f64, m.seq_len as f64);
        let eq2 = 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
        let ours = m.params().total as f64;
        assert!((ours - eq2 - 2.0 * h).abs() < 1.0, "{}: {ours} vs Eq.2 {eq2}", m.name);
        // And the table's rounded count, to the digit printed.
        let published = m.published_params.unwrap();
        assert!((ours - published).abs() <= 0.05e9 + 0.005 * published, "{}: {ours} vs {published}", m.name);
    }
}

#[test]
fn unknown_model_key_names_file_and_line() {
    let path = root().join("models/llama3-8b.toml");
    let text =
        std::fs::read_to_string(&path).unwrap().replace("vocab = 128256", "vocab = 128256\nvocabulary = 1");
    let line = text.lines().position(|l| l.starts_with("vocabulary")).unwrap() + 1;
    let e = parse_model(&text, &path).unwrap_err().to_string();
    assert!(e.contains(&format!("llama3-8b.toml:{line}:")), "{e}");
    assert!(e.contains("unknown field `vocabulary`"), "{e}");
    assert!(e.contains("`vocab`"), "valid keys are listed: {e}");
    let text = std::fs::read_to_string(&path).unwrap().replace("\"rmsnorm\"", "\"batchnorm\"");
    let e = parse_model(&text, &path).unwrap_err().to_string();
    assert!(e.contains("`norm`") && e.contains("rmsnorm, layernorm"), "{e}");
}

fn llama70_plan() -> Plan {
    Plan { tp: 8, pp: 4, dp: 4, mbs: 1, gbs: 64, sp: true, ..Plan::default() }
}

#[test]
fn bad_plans_name_the_field() {
    let m = model("llama3-70b");
    let moe = model("mixtral-8x7b");
    let ok = llama70_plan();
    ok.check(&m, 128).unwrap();
    let cases: Vec<(Plan, &Model, u64, &str, &str)> = vec![
        (ok.clone(), &m, 256, "dp", "256 GPUs"),
        (Plan { tp: 3, dp: 8, pp: 4, ..ok.clone() }, &m, 96, "tp", "64 attention heads"),
        (Plan { tp: 16, dp: 2, ..ok.clone() }, &m, 128, "tp", "8 KV groups"),
        (Plan { vpp: 21, ..ok.clone() }, &m, 128, "vpp", "pp × vpp = 4 × 21 = 84"),
        (
            Plan { first_stage_layers: Some(10), ..ok.clone() },
            &m,
            128,
            "decoder_first_pipeline_num_layers",
            "the other 3 stages would share 70 layers",
        ),
        (
            Plan { pp: 1, dp: 16, gbs: 64, last_stage_layers: Some(10), ..ok.clone() },
            &m,
            128,
            "decoder_last_pipeline_num_layers",
            "needs pp ≥ 2",
        ),
        (
            Plan { vpp: 2, gbs: 64, first_stage_layers: Some(11), last_stage_layers: Some(21), ..ok.clone() },
            &m,
            128,
            "decoder_first_pipeline_num_layers",
            "vpp = 2 chunks",
        ),
        (Plan { ep: 2, ..ok.clone() }, &m, 128, "ep", "no experts"),
        (Plan { tp: 1, pp: 1, dp: 6, ep: 3, gbs: 6, ..Plan::default() }, &moe, 6, "ep", "8 experts"),
        (
            Plan { tp: 1, pp: 1, dp: 4, ep: 8, gbs: 4, ..Plan::default() },
            &moe,
            4,
            "ep",
            "must divide tp / etp × cp × dp = 4",
        ),
        (Plan { gbs: 30, ..ok.clone() }, &m, 128, "gbs", "dp × mbs"),
        // A billion micro-batches took the pipeline schedule past the machine's memory.
        (Plan { gbs: 4_000_000_000, ..ok.clone() }, &m, 128, "gbs", "at most 65536"),
        // A zero-token sequence gave a step of zero tokens and 0 TFLOP/s.
        (Plan { seq: Some(0), ..ok.clone() }, &m, 128, "seq", "at least 1"),
        // Sequence parallelism scatters each CP rank's sequence over the TP ranks.
        (Plan { seq: Some(8196), ..ok.clone() }, &m, 128, "seq", "multiple of cp × tp = 8"),
        (Plan { cp: 3, dp: 1, pp: 4, gbs: 4, seq: Some(8192), ..ok.clone() }, &m, 96, "seq", "2 × cp = 6"),
        (Plan { vpp: 5, gbs: 24, ..ok.clone() }, &m, 128, "gbs", "multiple of pp"),
        (Plan { vpp: 2, schedule: Some(Schedule::OneFOneB), ..ok.clone() }, &m, 128, "vpp", "interleaved"),
        (Plan { sharding: Sharding::FsdpHybrid { shard: 3 }, ..ok.clone() }, &m, 128, "fsdp_shard", "divide"),
        (
            Plan { tp: 2, pp: 1, dp: 4, ep: 4, sp: true, gbs: 4, etp: Some(3), ..Plan::default() },
            &moe,
            8,
            "etp",
            "divide tp",
        ),
        // Megatron-Core refuses MoE with TP but without sequence parallelism.
        (
            Plan { tp: 2, pp: 1, dp: 4, ep: 4, sp: false, gbs: 4, ..Plan::default() },
            &moe,
            8,
            "sp",
            "needs sequence parallelism",
        ),
    ];
    // Found by fuzzing `train`: sizes `check` let through that aborted or hung the estimate
    // (a 1-byte bucket asked for 128 GB, a 2^40-token sequence 64 GB, mbs 2^32 ran for
    // minutes), and a GPU count tp × pp × cp does not divide, which blamed the unset dp.
    let more: Vec<(Plan, &Model, u64, &str, &str)> = vec![
        (Plan { bucket_bytes: 1, ..ok.clone() }, &m, 128, "bucket", "at most 65536 are simulated"),
        (Plan { seq: Some(1 << 40), ..ok.clone() }, &m, 128, "seq", "at most 134217728"),
        (Plan { mbs: 1 << 32, gbs: 4 << 32, ..ok.clone() }, &m, 128, "mbs", "tokens per micro-batch"),
        (
            Plan { tp: 3, pp: 1, dp: 2, ..Plan::default() },
            &m,
            8,
            "tp",
            "= 3 does not divide the cluster's 8 GPUs",
        ),
        (Plan { tp: u64::MAX, pp: u64::MAX, ..ok.clone() }, &m, 128, "tp", "more than 2^64"),
        (Plan { dp: 8, ..ok.clone() }, &m, 128, "dp", "valid: dp = 4"),
        // Accepted and ignored before: interleaving without a pipeline, expert keys on a
        // dense model.
        (Plan { pp: 1, dp: 16, vpp: 2, ..ok.clone() }, &m, 128, "vpp", "valid: vpp = 1, or pp ≥ 2"),
        (Plan { etp: Some(1), ..ok.clone() }, &m, 128, "etp", "has none"),
        (Plan { ep_imbalance: 1.5, ..ok.clone() }, &m, 128, "ep_imbalance", "has none"),
    ];
    for (plan, model, gpus, field, text) in cases.into_iter().chain(more) {
        let e = plan.check(model, gpus).expect_err(field);
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(text), "{e} should mention {text}");
    }
}

/// Uneven pipeline layouts: Llama 3 405B's 126 layers on 16 stages (the Llama 3 paper's
/// split: one layer fewer on the first and the last stage), DeepSeek-V3's 61, Megatron's
/// explicit first/last stage sizes, and the memory of each stage from its own layers.
#[test]
fn uneven_pipeline_layouts_split_like_megatron() {
    use fabricsim::workload::memory::stage_params;
    let big = model("llama3-405b");
    let plan = Plan { tp: 8, pp: 16, dp: 128, mbs: 1, gbs: 2048, sp: true, ..Plan::default() };
    plan.check(&big, 16384).unwrap();
    let mut want = vec![8u64; 16];
    want[0] = 7;
    want[15] = 7;
    assert_eq!(plan.stage_layers(big.layers), want);
    assert_eq!(plan.vstage_layers(126, 0), 0..7);
    assert_eq!(plan.vstage_layers(126, 1), 7..15);
    assert_eq!(plan.vstage_layers(126, 15), 119..126);
    // Interleaved (vpp 2): 3 layers in the first and last chunk, 4 in the others.
    let vp = Plan { vpp: 2, ..plan.clone() };
    vp.check(&big, 16384).unwrap();
    assert_eq!(vp.stage_layers(126), want);
    assert_eq!((vp.vstage_layers(126, 0), vp.vstage_layers(126, 16)), (0..3, 63..67));
    // DeepSeek-V3: 61 layers + 2 = 63 slots over 16 stages.
    let ds = model("deepseek-v3");
    let p = Plan { pp: 16, dp: 1, gbs: 16, ..Plan::default() };
    let mut want = vec![4u64; 16];
    (want[0], want[14], want[15]) = (3, 3, 3);
    assert_eq!(p.stage_layers(ds.layers), want);
    // Explicit sizes: the rest shared evenly.
    let ex = Plan { first_stage_layers: Some(6), last_stage_layers: Some(8), ..plan.clone() };
    ex.check(&big, 16384).unwrap();
    let mut want = vec![8u64; 16];
    want[0] = 6;
    assert_eq!(ex.stage_layers(126), want);
    // Divisible layers keep the even split, with and without interleaving.
    let m70 = model("llama3-70b");
    for (pp, vpp) in [(1, 1), (2, 1), (4, 1), (4, 5), (8, 5), (2, 4)] {
        let p = Plan { pp, vpp, ..Plan::default() };
        for vs in 0..pp * vpp {
            let n = 80 / (pp * vpp);
            assert_eq!(p.vstage_layers(80, vs), vs * n..(vs + 1) * n, "pp {pp} vpp {vpp}");
        }
        assert_eq!(p.vstage_layers(m70.layers, 0).start, 0);
    }
    // Every split covers the layers once, in order, each virtual stage non-empty.
    for layers in 1..=70u64 {
        for pp in 1..=12u64 {
            for vpp in 1..=3u64 {
                let p = Plan { pp, vpp, ..Plan::default() };
                if p.check_layout(layers).is_err() {
                    assert!(pp * vpp > (layers + 2) / 2, "{layers} layers, pp {pp} vpp {vpp} rejected");
                    continue;
                }
                let mut at = 0;
                for vs in 0..pp * vpp {
                    let r = p.vstage_layers(layers, vs);
                    assert!(
                        r.start == at && r.end > r.start,
                        "{layers} layers pp {pp} vpp {vpp} vs {vs}: {r:?}"
                    );
                    at = r.end;
                }
                assert_eq!(at, layers);
            }
        }
    }
    // Memory per stage from its own layers: stage 0 holds 7 layers and the embedding,
    // stages 1-14 eight layers each, stage 15 seven and the output layer.
    let layer = |l: u64| {
        let p = big.layer_params(l);
        // Per TP rank: the matrices split over 8 ranks, the norms replicated.
        (p.dense() - p.norms) / 8 + p.norms
    };
    assert_eq!(stage_params(&big, &plan, 1).0, (7..15).map(layer).sum::<u64>());
    assert_eq!(stage_params(&big, &plan, 0).0, (0..7).map(layer).sum::<u64>() + big.embedding_params() / 8);
    let mem = memory_by_stage(&big, &plan).unwrap();
    // 16 chunks of 7 layers in flight on stage 0 against 15 of 8 on stage 1.
    assert!(mem[1].activations > mem[0].activations, "{:?} {:?}", mem[0], mem[1]);
}

/// The slowest stage bounds the pipeline: Llama 3 8B on two stages with 28 layers on the
/// first and 4 on the second, no communication and no data parallelism. The first stage's
/// forward (28 layers) outlasts the second stage's forward and backward (4 layers and the
/// output layer), so under 1F1B the first stage never waits: the step is exactly its m
/// forwards and backwards plus the optimizer step, and the balanced split (16 + 16) is faster.
#[test]
fn the_slowest_stage_decides_the_step() {
    use fabricsim::workload::compute::{chunk_cost, optimizer_time, Roofline};
    use fabricsim::workload::memory::stage_params;
    use fabricsim::workload::plan::Dtype;
    let m = model("llama3-8b");
    let g = gpu("dgx-h100.toml");
    let params = GpuParams::for_generation(g.generation).unwrap();
    let r = Roofline::new(&g, Dtype::Bf16, params).unwrap();
    let free = |_: CollectiveKind, _: u64, _: &[u64]| 0.0;
    let plan = Plan {
        pp: 2,
        gbs: 8,
        seq: Some(2048),
        first_stage_layers: Some(28),
        last_stage_layers: Some(4),
        schedule: Some(Schedule::OneFOneB),
        ..Plan::default()
    };
    plan.check(&m, 2).unwrap();
    assert_eq!(plan.stage_layers(32), [28, 4]);
    let (c0, c1) = (chunk_cost(&m, &plan, &r, 0, 0), chunk_cost(&m, &plan, &r, 1, 0));
    assert!(c0.fwd >= c1.fwd + c1.bwd() && c0.bwd() >= c1.fwd + c1.bwd(), "{c0:?} {c1:?}");
    let opt = (0..2).map(|s| optimizer_time(&r, stage_params(&m, &plan, s).0)).fold(0.0, f64::max);
    let want = 8.0 * (c0.fwd + c0.bwd()) + opt;
    let e = run("llama3-8b", &plan, "dgx-h100.toml", &free);
    assert!(rel_err(e.step_time_s, want) < 1e-12, "{} vs {want}", e.step_time_s);
    assert!(e.breakdown.bubble.abs() < 1e-12 * want, "{:?}", e.breakdown);
    let even = run(
        "llama3-8b",
        &Plan { first_stage_layers: None, last_stage_layers: None, ..plan },
        "dgx-h100.toml",
        &free,
    );
    assert!(even.step_time_s < 0.8 * e.step_time_s, "{} vs {}", even.step_time_s, e.step_time_s);
}

#[test]
fn plan_file_errors_name_file_line_and_choices() {
    let m = model("llama3-70b");
    let path = Path::new("plan.toml");
    let good = "tp = 8\npp = 4\nvpp = 5\nmbs = 1\ngbs = 64\nrecompute = \"selective\"\nzero = 1\n";
    let p = parse_plan(good, path, &m, 128).unwrap();
    assert_eq!(
        (p.dp, p.schedule(), p.recompute, p.sharding),
        (4, Schedule::Interleaved, Recompute::Selective, Sharding::Zero(1))
    );
    assert!(p.sp, "sp defaults on with tp > 1");
    let e = parse_plan(&good.replace("tp = 8", "tp = 16"), path, &m, 128).unwrap_err().to_string();
    assert!(e.starts_with("plan.toml:1:") && e.contains("`tp`") && e.contains("valid: 1, 2, 4, 8"), "{e}");
    let e = parse_plan(&good.replace("vpp = 5", "vpp = 30"), path, &m, 128).unwrap_err().to_string();
    assert!(e.starts_with("plan.toml:3:") && e.contains("`vpp`"), "{e}");
    let e = parse_plan(&format!("{good}decoder_last_pipeline_num_layers = 7\n"), path, &m, 128)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("plan.toml:8:")
            && e.contains(
                "the last stage must hold 80 minus a multiple of 3 layers (nearest: 5 or 8, not 7)"
            ),
        "{e}"
    );
    // No first stage of 0 layers, and no wrapped-around "nearest" value below it.
    let e = parse_plan(&format!("{good}decoder_first_pipeline_num_layers = 0\n"), path, &m, 128)
        .unwrap_err()
        .to_string();
    assert!(e.contains("(nearest: 2, not 0)"), "{e}");
    let p = parse_plan(&format!("{good}decoder_last_pipeline_num_layers = 20\n"), path, &m, 128).unwrap();
    assert_eq!(p.stage_layers(80), [20, 20, 20, 20]);
    let e = parse_plan(&format!("{good}dtype = \"fp16\"\n"), path, &m, 128).unwrap_err().to_string();
    assert!(e.starts_with("plan.toml:8:") && e.contains("bf16, fp8"), "{e}");
    let e = parse_plan(&format!("{good}schedule = \"dualpipe\"\n"), path, &m, 128).unwrap_err().to_string();
    assert!(e.contains("gpipe, 1f1b, interleaved, zb-h1"), "{e}");
    let e = parse_plan(&format!("{good}tensor_parallel = 2\n"), path, &m, 128).unwrap_err().to_string();
    assert!(e.starts_with("plan.toml:8:") && e.contains("unknown field `tensor_parallel`"), "{e}");
    // Hybrid sharding without a group size: a node's 8 ranks, or what of them divides dp × cp
    // (it was 8 whatever dp, and an error on the key the plan never set).
    let hybrid = good.replace("zero = 1", "fsdp = \"hybrid\"");
    let p = parse_plan(&hybrid, path, &m, 128).unwrap();
    assert_eq!((p.dp, p.sharding), (4, Sharding::FsdpHybrid { shard: 4 }));
    let p =
        parse_plan(&hybrid.replace("pp = 4", "pp = 1").replace("vpp = 5", "vpp = 1"), path, &m, 128).unwrap();
    assert_eq!((p.dp, p.sharding), (16, Sharding::FsdpHybrid { shard: 8 }));
    let e = parse_plan(&format!("{good}fsdp_shard = 4\n"), path, &m, 128).unwrap_err().to_string();
    assert!(e.starts_with("plan.toml:8:") && e.contains("needs fsdp = \"hybrid\", not zero = 1"), "{e}");
    // Keys that change nothing in the plan run, with a note each.
    let dense = "tp = 1\npp = 1\nmbs = 1\ngbs = 128\n";
    let (_, notes) = parse_plan_noted(dense, path, &m, 128).unwrap();
    assert!(notes.is_empty(), "{notes:?}");
    let inert = "sp = true\ntp_comm_overlap = true\ncp_comm = \"all_gather\"\npp_comm_overlap = false\n\
                 pp_scatter_gather = false\noverlap_param_gather = true\nep_seed = 3\n";
    let (p, notes) = parse_plan_noted(&format!("{dense}{inert}"), path, &m, 128).unwrap();
    assert_eq!(p.tp, 1);
    let keys = [
        "`sp`",
        "`tp_comm_overlap`",
        "`cp_comm`",
        "`pp_comm_overlap`",
        "`pp_scatter_gather`",
        "`overlap_param_gather`",
        "`ep_seed`",
    ];
    assert_eq!(notes.len(), keys.len(), "{notes:?}");
    for (n, k) in notes.iter().zip(keys) {
        assert!(n.starts_with(k) && n.contains("no effect"), "{n}");
    }
    // Each one has its effect once the plan has what it acts on.
    let (_, notes) = parse_plan_noted(
        &format!("{good}sp = true\npp_comm_overlap = false\noverlap_param_gather = true\n"),
        path,
        &m,
        128,
    )
    .unwrap();
    assert!(notes.is_empty(), "{notes:?}");
}

#[test]
fn placement_follows_megatron_order() {
    // Llama-3-70B, TP8 PP4 DP4 on 128 GPUs: TP groups are the 8 GPUs of a node, DP strides
    // by 8, PP by 32.
    let pl = Placement::new(&llama70_plan());
    let tp = pl.groups(GroupKind::Tp);
    assert_eq!(tp.len(), 16);
    assert_eq!(tp[0], (0..8).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::Dp, 3), vec![3, 11, 19, 27]);
    assert_eq!(pl.group_of(GroupKind::Pp, 9), vec![9, 41, 73, 105]);
    assert_eq!(pl.coord(105), Coord { tp: 1, cp: 0, ep: 0, dp: 1, pp: 3 });
    // Every kind partitions the ranks.
    for kind in [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::Ep,
        GroupKind::Dp,
        GroupKind::DpCp,
        GroupKind::ExpertDp,
        GroupKind::Pp,
    ] {
        let mut all: Vec<u64> = pl.groups(kind).into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..128).collect::<Vec<u64>>(), "{kind:?}");
        for g in pl.groups(kind) {
            for &r in &g {
                assert_eq!(pl.group_of(kind, r), g, "{kind:?} of {r}");
            }
        }
    }
    // Every dimension at once, expert-TP below TP, another order: group_of agrees with groups.
    let plan = Plan {
        tp: 4,
        cp: 2,
        ep: 2,
        dp: 4,
        pp: 2,
        etp: Some(2),
        order: parse_order("tp-dp-cp-ep-pp").unwrap(),
        ..Plan::default()
    };
    let pl = Placement::new(&plan);
    for kind in [
        GroupKind::Tp,
        GroupKind::Cp,
        GroupKind::Ep,
        GroupKind::Dp,
        GroupKind::DpCp,
        GroupKind::ExpertDp,
        GroupKind::Pp,
    ] {
        for g in pl.groups(kind) {
            assert_eq!(pl.group_of(kind, g[g.len() - 1]), g, "{kind:?}");
        }
    }
    // FSDP hybrid sharding over 2 of the 4 DP ranks: shard groups and replica groups.
    let pl = Placement::new(&Plan { sharding: Sharding::FsdpHybrid { shard: 2 }, ..llama70_plan() });
    assert_eq!(pl.group_of(GroupKind::FsdpShard, 19), vec![19, 27]);
    assert_eq!(pl.group_of(GroupKind::FsdpReplica, 19), vec![3, 19]);
    // Mixtral TP1 EP8 PP4 on 64 GPUs (the MCore README mapping): EP groups are the 8 GPUs of
    // a node, the expert gradient group strides by 8 and DP (dense) holds the EP group.
    let plan = Plan { tp: 1, ep: 8, pp: 4, dp: 16, vpp: 8, gbs: 256, ..Plan::default() };
    plan.check(&model("mixtral-8x7b"), 64).unwrap();
    let pl = Placement::new(&plan);
    assert_eq!(pl.group_of(GroupKind::Ep, 0), (0..8).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::ExpertDp, 1), vec![1, 9]);
    assert_eq!(pl.group_of(GroupKind::Dp, 0), (0..16).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::Pp, 0), vec![0, 16, 32, 48]);
    // Megatron-Core's MoE parallel folding: the expert grid (expert-TP, EP, expert-DP) is laid
    // over each stage's ranks in order, whatever the attention's TP and CP. DeepSeek-V3 on
    // 1,024 H100 (Megatron-Bridge: TP2 PP8 EP64, expert-TP 1): EP groups are 64 consecutive
    // ranks (8 whole nodes), not every other rank over 16 nodes as the attention grid's `ep`
    // would put them.
    let plan =
        Plan { tp: 2, pp: 8, vpp: 4, dp: 64, ep: 64, etp: Some(1), sp: true, gbs: 8192, ..Plan::default() };
    plan.check(&model("deepseek-v3"), 1024).unwrap();
    let pl = Placement::new(&plan);
    assert_eq!(pl.group_of(GroupKind::Ep, 0), (0..64).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::Ep, 200), (192..256).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::ExpertDp, 3), vec![3, 67]);
    assert_eq!(pl.group_of(GroupKind::Etp, 3), vec![3]);
    assert_eq!(pl.group_of(GroupKind::Tp, 3), vec![2, 3]);
    // Folding lets EP exceed DP: on 512 GPUs DP is 32 and EP 64 spans both TP ranks.
    let half = Plan { dp: 32, gbs: 4096, ..plan.clone() };
    half.check(&model("deepseek-v3"), 512).unwrap();
    let pl = Placement::new(&half);
    assert_eq!(pl.group_of(GroupKind::Ep, 70), (64..128).collect::<Vec<u64>>());
    assert_eq!(pl.group_of(GroupKind::ExpertDp, 70), vec![70]);
    // Expert-TP = TP under CP 2: EP strides by TP (2), not by TP x CP as an EP laid on the
    // attention's grid did; expert-TP groups are the TP pairs, expert-DP the rest of the stage.
    let plan = Plan { tp: 2, cp: 2, ep: 2, dp: 4, pp: 1, ..Plan::default() };
    let pl = Placement::new(&plan);
    assert_eq!(pl.group_of(GroupKind::Ep, 0), vec![0, 2]);
    assert_eq!(pl.group_of(GroupKind::Etp, 0), vec![0, 1]);
    assert_eq!(pl.group_of(GroupKind::ExpertDp, 0), vec![0, 4, 8, 12]);
    for kind in [GroupKind::Ep, GroupKind::Etp, GroupKind::ExpertDp] {
        let mut all: Vec<u64> = pl.groups(kind).into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..16).collect::<Vec<u64>>(), "{kind:?}");
        for g in pl.groups(kind) {
            assert_eq!(pl.group_of(kind, g[1]), g, "{kind:?}");
        }
    }
    assert!(pl
        .describe()
        .contains("experts folded over each stage's ranks: etp 2 (stride 1), ep 2 (stride 2)"));
}

// ---------------------------------------------------------------- FLOPs

#[test]
fn model_flops_match_published_formulas() {
    use fabricsim::workload::flops::{model_flops_per_sequence, recompute_flops_per_sequence};
    // NVIDIA dgxc-benchmarking worked values per sequence (TRAINING_BENCH.md Sec. 9).
    for (name, seq, want) in
        [("llama3-70b", 8192, 3.94e15), ("llama3-8b", 8192, 4.74e14), ("gpt3-175b", 2048, 2.20e15)]
    {
        let got = model_flops_per_sequence(&model(name), seq);
        assert!(rel_err(got, want) < 0.006, "{name}: {got:.3e} vs {want:.3e}");
    }
    // Nemotron-4 340B: the README's non-gated formula s (24 L h^2 + 12 L h s + 48 L h^2 +
    // 6 V h) = 1.01e16 counts K and V as in MHA; with the model's 8 KV groups the same
    // count is s (12 L h^2 (1 + G/A + s/h) + 12 L F h + 6 V h).
    let m = model("nemotron4-340b");
    let (l, h, f, v, s, g, a) = (96.0, 18432.0, 73728.0, 256000.0, 4096.0, 8.0, 96.0);
    let mha = s * (24.0 * l * h * h + 12.0 * l * h * s + 48.0 * l * h * h + 6.0 * v * h);
    assert!(rel_err(mha, 1.01e16) < 0.006);
    let gqa = s * (12.0 * l * h * h * (1.0 + g / a + s / h) + 12.0 * l * f * h + 6.0 * v * h);
    assert!(rel_err(model_flops_per_sequence(&m, 4096), gqa) < 1e-12);
    // Narayanan et al. Eq. (3), full recomputation: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).
    let m = model("gpt3-175b");
    let (s, l, h, v) = (2048.0, 96.0, 12288.0, 51200.0);
    let eq3 = 96.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
    let ours = model_flops_per_sequence(&m, 2048)
        + recompute_flops_per_sequence(&m, 2048, &Plan { recompute: Recompute::Full, ..Plan::default() });
    assert!(rel_err(ours, eq3) < 1e-12, "{ours} vs {eq3}");
    // Korthikanti Eq. 7 (no recomputation): 72 B L s h^2 (1 + s/(6h) + V/(12 h L)).
    let eq7 = 72.0 * l * s * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
    assert!(rel_err(model_flops_per_sequence(&m, 2048), eq7) < 1e-12);
}

#[test]
fn moe_flops_count_only_routed_experts() {
    use fabricsim::workload::flops::model_flops_per_sequence;
    // 6 x active parameters per token (no attention term at s = 1 beyond 12 L (dq+dv) heads)
    // for Mixtral: routed experts cost top_k, not all of them.
    let m = model("mixtral-8x7b");
    let per_token = model_flops_per_sequence(&m, 1);
    let p = m.params();
    let matmul_active = (p.active - p.embedding - m.layers * m.layer_params(0).norms - m.hidden) as f64;
    let attention = 3.0 * 2.0 * (m.layers * m.heads * 2 * m.head_dim) as f64;
    assert!(
        rel_err(per_token, 6.0 * matmul_active + attention) < 1e-9,
        "{per_token} vs {}",
        6.0 * matmul_active
    );
}

// ---------------------------------------------------------------- pipeline

use fabricsim::workload::pipeline::{Pass, PipelineSchedule};

fn uniform(s: &PipelineSchedule, tf: f64, tb: f64, tw: f64) -> f64 {
    let v = s.chunks as f64;
    s.time(
        |_, o| match o.pass {
            Pass::F => tf / v,
            Pass::B => tb / v,
            Pass::W => tw / v,
        },
        |_, _| 0.0,
    )
    .unwrap()
    .bubble_fraction()
}

#[test]
fn pipeline_bubbles_match_closed_forms() {
    for (p, m) in [(2u32, 4u32), (4, 8), (4, 16), (8, 8), (8, 32)] {
        let want = (p - 1) as f64 / m as f64;
        for kind in [Schedule::GPipe, Schedule::OneFOneB] {
            let s = PipelineSchedule::build(kind, p, 1, m).unwrap();
            let got = uniform(&s, 1.0, 2.0, 0.0);
            assert!((got - want).abs() < 1e-12, "{kind:?} p={p} m={m}: {got} vs {want}");
        }
        for v in [2u32, 3, 4] {
            let s = PipelineSchedule::build(Schedule::Interleaved, p, v, m).unwrap();
            let got = uniform(&s, 1.0, 2.0, 0.0);
            let want = (p - 1) as f64 / (m * v) as f64;
            assert!((got - want).abs() < 1e-12, "interleaved p={p} v={v} m={m}: {got} vs {want}");
        }
        // ZB-H1 with equal F, B and W: the bubble shrinks to (p-1) (T_F + T_B - T_W) (Qi et
        // al. 2023), a third of 1F1B's.
        let s = PipelineSchedule::build(Schedule::ZbH1, p, 1, m).unwrap();
        let got = uniform(&s, 1.0, 1.0, 1.0);
        let want = (p - 1) as f64 / (3.0 * m as f64);
        assert!((got - want).abs() < 1e-12, "zb-h1 p={p} m={m}: {got} vs {want}");
    }
}

#[test]
fn pipeline_p2p_delays_only_dependent_ops() {
    // GPipe, p = 4, m = 8, F = 1, B = 2, p2p = 0.5: the critical path crosses each of the
    // p - 1 boundaries twice (forward in, backward out), and the stages' work is unchanged.
    let f_b = |_: u32, o: &fabricsim::workload::pipeline::PipeOp| if o.pass == Pass::F { 1.0 } else { 2.0 };
    let s = PipelineSchedule::build(Schedule::GPipe, 4, 1, 8).unwrap();
    let t = s.time(f_b, |_, _| 0.5).unwrap();
    assert!((t.makespan - ((8.0 + 3.0) * 3.0 + 2.0 * 3.0 * 0.5)).abs() < 1e-12, "{}", t.makespan);
    assert_eq!(t.busy, vec![24.0; 4]);
    // 1F1B couples stages in its steady state, so transfers cost at least as much.
    let s = PipelineSchedule::build(Schedule::OneFOneB, 4, 1, 8).unwrap();
    let t = s.time(f_b, |_, _| 0.5).unwrap();
    assert!(t.makespan >= 33.0 + 3.0, "{}", t.makespan);
    // A schedule that cannot finish is an error, not a hang: B before its own F.
    let mut bad = PipelineSchedule::build(Schedule::OneFOneB, 1, 1, 2).unwrap();
    bad.ops[0].swap(0, 1);
    assert!(bad.time(f_b, |_, _| 0.0).unwrap_err().contains("deadlocks"));
}

#[test]
fn micro_batches_in_flight_per_stage() {
    let s = PipelineSchedule::build(Schedule::OneFOneB, 4, 1, 8).unwrap();
    assert_eq!(s.max_in_flight(), vec![4, 3, 2, 1]);
    let s = PipelineSchedule::build(Schedule::OneFOneB, 8, 1, 4).unwrap();
    assert_eq!(s.max_in_flight()[0], 4, "never more than m");
    let s = PipelineSchedule::build(Schedule::GPipe, 4, 1, 8).unwrap();
    assert_eq!(s.max_in_flight(), vec![8; 4]);
    // Interleaved: Korthikanti's (1 + (p-1)/(p v)) x p micro-batches of L/p layers on the
    // first stage, i.e. p v + p - 1 chunks of L/(p v) layers.
    for (p, v) in [(4u32, 2u32), (8, 3), (4, 5)] {
        let s = PipelineSchedule::build(Schedule::Interleaved, p, v, 4 * p).unwrap();
        assert_eq!(s.max_in_flight()[0], p * v + p - 1, "p={p} v={v}");
    }
}

// ---------------------------------------------------------------- memory

use fabricsim::workload::memory::{memory_by_stage, peak_memory, Category};

#[test]
fn llama3_70b_tp8_pp4_zero1_memory_by_hand() {
    let m = model("llama3-70b");
    let plan = Plan { sharding: Sharding::Zero(1), recompute: Recompute::Selective, ..llama70_plan() };
    plan.check(&m, 128).unwrap();
    let stages = memory_by_stage(&m, &plan).unwrap();
    let s0 = stages[0];
    // Per layer: q, k, v 8192 x (8192 + 1024 + 1024), out 8192 x 8192, SwiGLU 3 x 8192 x
    // 28672, two RMSNorms of 8192. Stage 0: 20 layers and the 128256 x 8192 embedding; TP
    // splits everything but the norms.
    let layer: u64 = 8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672;
    let norms: u64 = 2 * 8192;
    let params = (20 * layer + 128256 * 8192) / 8 + 20 * norms;
    assert_eq!(s0.params, 2 * params);
    assert_eq!(s0.grads, 2 * params);
    assert_eq!(s0.optimizer, 12 * params / 4, "ZeRO-1 over dp = 4");
    // Activations per layer and micro-batch (t = 8192 tokens, h = 8192, SP over 8): norm
    // inputs 4th, QKV input 2th, Q K V 2t(8192+1024+1024), attention output 2th, MLP input
    // 2th, gate+up 2t(2 x 28672), SwiGLU output 2t x 28672; 1F1B keeps 4 micro-batches of
    // 20 layers on stage 0.
    let t: u64 = 8192;
    let per_layer = (4 * t * 8192
        + 2 * t * 8192
        + 2 * t * 10240
        + 2 * t * 8192
        + 2 * t * 8192
        + 2 * t * 57344
        + 2 * t * 28672)
        / 8;
    assert_eq!(s0.activations, 4 * 20 * per_layer);
    // Two 80 MB gradient buckets and the all-gathered SP input of one layer.
    assert_eq!(s0.comm, 2 * 80_000_000 + 2 * t * 8192);
    assert_eq!(s0.total(), 38_670_985_216);
    assert!(s0.fits(80_000_000_000).is_ok());
    // The last stage holds 1 micro-batch in flight but the FP32 logits.
    assert_eq!(stages[3].activations, 20 * per_layer + 4 * t * 128256 / 8);
    assert_eq!(peak_memory(&m, &plan).unwrap().stage, 0);
}

#[test]
fn korthikanti_activation_formulas() {
    // GPT-3 175B, TP8 PP8, SP + selective: the first stage keeps 34 s b h L / t (Eq. 6);
    // interleaved with v = 3 multiplies it by (1 + (p-1)/(p v)).
    let m = model("gpt3-175b");
    let plan =
        Plan { tp: 8, pp: 8, dp: 1, sp: true, gbs: 64, recompute: Recompute::Selective, ..Plan::default() };
    plan.check(&m, 64).unwrap();
    let (s, h, l, t) = (2048u64, 12288u64, 96u64, 8u64);
    assert_eq!(memory_by_stage(&m, &plan).unwrap()[0].activations, 34 * s * h * l / t);
    let plan = Plan { vpp: 3, ..plan };
    let got = memory_by_stage(&m, &plan).unwrap()[0].activations as f64;
    let want = (34 * s * h * l / t) as f64 * (1.0 + 7.0 / 24.0);
    assert!(rel_err(got, want) < 1e-12, "{got} vs {want}");
    // Without SP: s b h (10 + 24/t) per layer.
    let plan = Plan { vpp: 1, sp: false, ..plan };
    assert_eq!(memory_by_stage(&m, &plan).unwrap()[0].activations, s * h * (10 * t + 24) * l / t);
    // Full recomputation keeps 2 s b h per layer (split by TP under SP), and while a layer's
    // backward runs, what it rebuilt: its whole 34 s b h / t less that input, once.
    let plan = Plan { sp: true, recompute: Recompute::Full, ..plan };
    assert_eq!(memory_by_stage(&m, &plan).unwrap()[0].activations, 2 * s * h * l / t + 32 * s * h / t);
}

#[test]
fn recomputation_rebuilds_one_layer_at_a_time() {
    // GPT-3 175B without model parallelism, unfused attention (Korthikanti's 5 a s / h term),
    // one micro-batch of 4 sequences: the single stage keeps each layer's input (2 s b h), the
    // FP32 logits (4 s b v), and during one layer's backward what recomputation rebuilt of it.
    let m = model("gpt3-175b");
    let base = Plan {
        dp: 8,
        mbs: 4,
        gbs: 32,
        attention: fabricsim::workload::plan::Attention::Unfused,
        ..Plan::default()
    };
    let (s, b, h, a, l, v) = (2048u64, 4u64, 12288u64, 96u64, 96u64, 51200u64);
    let acts = |p: &Plan| {
        p.check(&m, 8).unwrap();
        memory_by_stage(&m, p).unwrap()[0].activations
    };
    let logits = 4 * s * b * v;
    let whole_layer = s * b * h * 34 + 5 * a * s * s * b;
    // None: every layer whole, nothing rebuilt.
    assert_eq!(acts(&Plan { recompute: Recompute::None, ..base.clone() }), l * whole_layer + logits);
    // Full: the layers' inputs, and one layer's activations less its input.
    let full = acts(&Plan { recompute: Recompute::Full, ..base.clone() });
    assert_eq!(full, l * 2 * s * b * h + (whole_layer - 2 * s * b * h) + logits);
    // Selective (the attention core): 34 s b h per layer, and one layer's scores rebuilt.
    let sel = acts(&Plan { recompute: Recompute::Selective, ..base.clone() });
    assert_eq!(sel, l * 34 * s * b * h + 5 * a * s * s * b + logits);
    // Under FlashAttention selective recomputation drops nothing and rebuilds nothing.
    let flash = Plan { attention: fabricsim::workload::plan::Attention::Flash, ..base };
    let (sel, none) = (
        acts(&Plan { recompute: Recompute::Selective, ..flash.clone() }),
        acts(&Plan { recompute: Recompute::None, ..flash }),
    );
    assert_eq!(sel, none);
}

#[test]
fn zero3_holds_gathered_units_and_their_gradients() {
    // ZeRO-3 of GPT-3 175B over 64 GPUs: besides two gradient buckets, a GPU holds the unit
    // it gathered, that unit's gradients before their reduce-scatter, the next unit where
    // gathers run ahead, and under PyTorch's list API the NCCL call's flat buffer: three
    // layers' BF16 weights with prefetch, three of the layer's largest tensor (the MLP's
    // 4h x h, 4h^2 of the layer's 12h^2 + 13h parameters) as DeepSpeed's first ZeRO-3 ran.
    use fabricsim::workload::plan::GatherUnit;
    let m = model("gpt3-175b");
    let z3 = Plan { dp: 64, gbs: 64, sharding: Sharding::Zero(3), ..Plan::default() };
    z3.check(&m, 64).unwrap();
    let comm = |p: &Plan| {
        let mem = memory_by_stage(&m, p).unwrap()[0];
        mem.comm - (2 * p.bucket_bytes).min(mem.grads)
    };
    // The whole model is one chunk: a layer's share includes the embedding's.
    let layer = 2 * m.params().total / 96;
    assert_eq!(comm(&z3), 3 * layer);
    let no_prefetch = Plan { overlap: Overlap { param_gather: false, ..z3.overlap }, ..z3.clone() };
    assert_eq!(comm(&no_prefetch), 2 * layer);
    let h = 12288f64;
    let list = Plan { gather_unit: GatherUnit::TensorList, ..no_prefetch };
    let want = 3.0 * layer as f64 * 4.0 * h * h / (12.0 * h * h + 13.0 * h);
    assert!(rel_err(comm(&list) as f64, want) < 1e-6, "{} vs {want}", comm(&list));
}

#[test]
fn zero_stages_follow_the_zero_paper() {
    // Psi = 7.5B, N_d = 64: 120 / 31.4 / 16.6 / 1.9 GB (Rajbhandari et al. Sec. 5).
    let m = model("megatron-gpt-7.5b");
    let psi = m.params().total as f64;
    let mut got = Vec::new();
    for z in 0..=3 {
        let plan = Plan { dp: 64, gbs: 64, sharding: Sharding::Zero(z), ..Plan::default() };
        plan.check(&m, 64).unwrap();
        let mem = memory_by_stage(&m, &plan).unwrap()[0];
        got.push((mem.params + mem.grads + mem.optimizer) as f64);
    }
    let want = [16.0 * psi, 4.0 * psi + 12.0 * psi / 64.0, 2.0 * psi + 14.0 * psi / 64.0, 16.0 * psi / 64.0];
    for (g, w) in got.iter().zip(want) {
        assert!(rel_err(*g, w) < 1e-6, "{g} vs {w}");
    }
    assert!(rel_err(got[1], 31.4e9 * psi / 7.5e9) < 0.01);
}

#[test]
fn oom_names_the_largest_category() {
    // Llama-3-405B on 8 GPUs with TP8 and nothing else cannot fit 80 GB.
    let m = model("llama3-405b");
    let plan = Plan { tp: 8, sp: true, gbs: 1, ..Plan::default() };
    plan.check(&m, 8).unwrap();
    let mem = peak_memory(&m, &plan).unwrap();
    let e = mem.fits(80_000_000_000).unwrap_err();
    assert_eq!(e.largest.0, Category::Optimizer);
    assert!(e.need > 80_000_000_000 && e.to_string().contains("optimizer states"), "{e}");
}

// ---------------------------------------------------------------- analytic estimate

use fabricsim::fabric::{load_topology, GpuSpec};
use fabricsim::workload::analytic::{estimate, CollectiveKind, CommPricer, StepEstimate};
use fabricsim::workload::compute::GpuParams;

fn gpu(topology: &str) -> GpuSpec {
    load_topology(&root().join("topologies").join(topology)).unwrap().gpu
}

/// A simple bandwidth model: 8 GPUs per node on 450 GB/s NVLink, 50 GB/s per GPU between
/// nodes, ring bus factors, 10 us per call.
fn simple_comm(kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
    let n = ranks.len() as f64;
    let one_node = ranks.iter().all(|r| r / 8 == ranks[0] / 8);
    let bw = if one_node { 450e9 } else { 50e9 };
    let factor = match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => (n - 1.0) / n,
        CollectiveKind::SendRecv => 1.0,
    };
    10e-6 + factor * bytes as f64 / bw
}

fn run(model_name: &str, plan: &Plan, topology: &str, comm: &dyn CommPricer) -> StepEstimate {
    let g = gpu(topology);
    let params = GpuParams::for_generation(g.generation).unwrap();
    estimate(&model(model_name), plan, &g, params, comm).unwrap()
}

/// TP communication overlapped with the GEMMs (`tp_comm_overlap`) is hidden while it is
/// shorter than them, and the GEMMs it runs beside slow by the generation's SM share: on one
/// node with every TP collective far shorter than its layer's GEMMs, the exposed TP time is
/// that share of the TP time without the overlap, and the rest of the step does not move.
#[test]
fn overlapped_tp_communication_costs_the_sm_share() {
    let off = Plan { tp: 8, pp: 1, dp: 1, mbs: 1, gbs: 2, sp: true, ..Plan::default() };
    let mut on = off.clone();
    on.overlap.tp_comm = true;
    // 2 us per collective: far below any layer GEMM of Llama 3 70B at seq 8192.
    let fast = |_: CollectiveKind, _: u64, _: &[u64]| 2e-6;
    let (a, b) =
        (run("llama3-70b", &off, "dgx-h100.toml", &fast), run("llama3-70b", &on, "dgx-h100.toml", &fast));
    let share = GpuParams::for_generation(gpu("dgx-h100.toml").generation).unwrap().overlap_slowdown;
    assert!(share > 0.0 && a.breakdown.tp > 0.0);
    assert!(
        rel_err(b.breakdown.tp, share * a.breakdown.tp) < 1e-9,
        "{} vs {share} x {}",
        b.breakdown.tp,
        a.breakdown.tp
    );
    assert!(rel_err(b.breakdown.compute, a.breakdown.compute) < 1e-12);
    let saved = a.step_time_s - b.step_time_s;
    assert!(rel_err(saved, (1.0 - share) * a.breakdown.tp) < 1e-6, "saved {saved} s of {} s", a.breakdown.tp);
}

#[test]
fn layer_ops_split_the_layer_over_tp_and_cp() {
    use fabricsim::workload::compute::{layer_ops, OpKind, Roofline};
    use fabricsim::workload::flops::{attention, layer_gemms, Gemm};
    use fabricsim::workload::plan::Dtype;
    let m = model("llama3-70b");
    let plan = Plan { cp: 2, dp: 2, ..llama70_plan() };
    plan.check(&m, 128).unwrap();
    let g = gpu("dgx-h100.toml");
    let r = Roofline::new(&g, Dtype::Bf16, GpuParams::for_generation(g.generation).unwrap()).unwrap();
    let ops = layer_ops(&m, &plan, &r, 0);
    let names: Vec<&str> = ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["qkv", "attention", "attn_out", "mlp_up", "mlp_down", "elementwise"]);
    let gemm: f64 = ops.iter().filter(|o| o.kind == OpKind::Gemm).map(|o| o.flops).sum();
    let whole: f64 = layer_gemms(&m, 0, 8192 / 2).iter().map(Gemm::flops).sum();
    assert!(rel_err(gemm * 8.0, whole) < 1e-12);
    let att = ops.iter().find(|o| o.kind == OpKind::Attention).unwrap();
    assert!(rel_err(att.flops * 16.0, attention(&m, 1, 8192).flops_causal()) < 1e-12);
    for o in &ops {
        assert!(o.fwd > 0.0 && o.bwd_input > 0.0, "{o:?}");
        assert_eq!(o.bwd_weight > 0.0, o.kind == OpKind::Gemm, "{o:?}");
    }
}

/// Under FP8 each GEMM keeps the FP8 copy of its input for the weight gradient: per layer
/// of Llama 3 70B (TP 8 with SP, seq 8192) the QKV, attention-projection, MLP-up and
/// MLP-down inputs take 1 byte per element instead of 2, the rest (norm inputs, Q, K, V,
/// the gated up-projection) stays BF16; the 405B run of Megatron-Bridge on GB200 (TP 4,
/// PP 16, VP 4), which ran, fits in HBM only with it.
#[test]
fn fp8_plans_keep_their_gemm_inputs_in_fp8() {
    use fabricsim::workload::memory::layer_activation_bytes;
    use fabricsim::workload::plan::Dtype;
    let m = model("llama3-70b");
    let bf16 = Plan { tp: 8, pp: 1, dp: 1, mbs: 1, gbs: 1, sp: true, ..Plan::default() };
    let fp8 = Plan { dtype: Dtype::Fp8, ..bf16.clone() };
    let t = 8192;
    let (h, a, f) = (m.hidden, m.attn_out_dim(), m.ffn_hidden);
    // One byte less per element of: the QKV and MLP-up inputs (h each, split by SP), the
    // projection input (a) and the MLP-down input (f), split by TP.
    let saved = (t * h + t * h) / 8 + (t * a + t * f) / 8;
    assert_eq!(layer_activation_bytes(&m, &bf16, 0) - layer_activation_bytes(&m, &fp8, 0), saved);
    let big = model("llama3-405b");
    let gb200 = Plan {
        tp: 4,
        pp: 16,
        vpp: 4,
        dp: 4,
        mbs: 1,
        gbs: 1536,
        sp: true,
        dtype: Dtype::Fp8,
        sharding: Sharding::Zero(1),
        ..Plan::default()
    };
    let hbm = gpu("gb200-nvl72.toml").hbm_bytes;
    let mem = peak_memory(&big, &gb200).unwrap();
    assert!(mem.fits(hbm).is_ok(), "{mem:?}");
    let as_bf16 = peak_memory(&big, &Plan { dtype: Dtype::Bf16, ..gb200.clone() }).unwrap();
    assert!(as_bf16.fits(hbm).is_err(), "{as_bf16:?}");
}

#[test]
fn unfused_attention_computes_the_whole_score_matrix_and_keeps_it_unless_recomputed() {
    use fabricsim::workload::compute::{layer_ops, OpKind, Roofline};
    use fabricsim::workload::flops::attention;
    use fabricsim::workload::memory::layer_activation_bytes;
    use fabricsim::workload::plan::{Attention, Dtype};
    // GPT 22B as Korthikanti et al. ran it (TP 8, mbs 4, seq 2048, dropout on).
    let m = model("megatron-gpt-22b");
    let flash = Plan { tp: 8, mbs: 4, gbs: 4, sp: true, ..Plan::default() };
    let unfused = Plan { attention: Attention::Unfused, ..flash.clone() };
    let g = gpu("dgx-a100.toml");
    let r = Roofline::new(&g, Dtype::Bf16, GpuParams::for_generation(g.generation).unwrap()).unwrap();
    let att = |p: &Plan| layer_ops(&m, p, &r, 0).into_iter().find(|o| o.kind == OpKind::Attention).unwrap();
    let (f, u) = (att(&flash), att(&unfused));
    // Every score of the s x s matrix is computed, not the causal half.
    assert!(rel_err(u.flops * 8.0, attention(&m, 4, 2048).flops_full()) < 1e-12);
    assert!(rel_err(u.flops, 2.0 * f.flops) < 1e-12);
    // 9 bytes per score forward through HBM: 4 heads-shard x 4 sequences x 2048 x 2048.
    let scores = (m.heads / 8 * 4 * 2048 * 2048) as f64;
    assert!(rel_err(u.bytes, 9.0 * scores) < 1e-12, "{} bytes", u.bytes);
    assert!(u.fwd > f.fwd && u.bwd_input > f.bwd_input, "{u:?} vs {f:?}");
    // Memory: Korthikanti's 5as/h term per layer (softmax output, dropout mask and output,
    // split by TP) without recomputation, nothing once the attention core is recomputed.
    let kept = |p: &Plan| layer_activation_bytes(&m, p, 0);
    assert_eq!(kept(&unfused) - kept(&flash), 5 * 4 * m.heads * 2048 * 2048 / 8);
    for rc in [Recompute::Selective, Recompute::Full] {
        let (a, b) = (Plan { recompute: rc, ..unfused.clone() }, Plan { recompute: rc, ..flash.clone() });
        assert_eq!(kept(&a), kept(&b), "{rc:?}");
    }
    // A plan file names the kernel; an unknown one is an error that lists the valid ones.
    let dir = std::env::temp_dir().join(format!("fabricsim-attention-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("plan.toml");
    std::fs::write(&file, "tp = 8\nmbs = 4\ngbs = 4\nattention = \"fast\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["train", "--model"])
        .arg(root().join("models/megatron-gpt-22b.toml"))
        .arg("--topology")
        .arg(root().join("topologies/dgx-a100.toml"))
        .arg("--plan")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("plan.toml:4") && err.contains("valid: flash, unfused"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_layer_issues_megatron_communication_volumes() {
    use fabricsim::workload::comm::{grad_reduces, layer_comms, p2p_bytes, CollectiveKind};
    use fabricsim::workload::pipeline::Pass;
    // TP with SP: two all-gathers and two reduce-scatters of b s h (BF16) each way.
    let m = model("llama3-70b");
    let plan = llama70_plan();
    let ops = layer_comms(&m, &plan, 0);
    let bsh = 2 * 8192 * 8192;
    assert_eq!(ops.len(), 4);
    for op in &ops {
        assert_eq!((op.group, op.bytes, op.count), (GroupKind::Tp, bsh, 2), "{op:?}");
    }
    assert_eq!(ops.iter().filter(|o| o.pass == Pass::B && o.kind == CollectiveKind::AllGather).count(), 1);
    // Scatter/gather: a stage sends b s h / t.
    assert_eq!(p2p_bytes(&m, &plan), bsh / 8);
    // Without SP: all-reduces; with CP 2: K and V of the local tokens go once around.
    let plan = Plan { sp: false, cp: 2, dp: 2, ..llama70_plan() };
    let ops = layer_comms(&m, &plan, 0);
    assert!(ops.iter().all(|o| o.kind != CollectiveKind::AllGather));
    let kv = ops.iter().find(|o| o.group == GroupKind::Cp && o.pass == Pass::F).unwrap();
    assert_eq!((kv.bytes, kv.count), (2 * 4096 * (1024 + 8192) / 8, 1));
    // Mixtral with EP 8: dispatch and combine of top-2 tokens each way.
    let mix = model("mixtral-8x7b");
    let plan = Plan { ep: 8, pp: 4, dp: 16, vpp: 8, gbs: 256, ..Plan::default() };
    let a2a: Vec<_> =
        layer_comms(&mix, &plan, 5).into_iter().filter(|o| o.kind == CollectiveKind::AllToAll).collect();
    assert_eq!(a2a.len(), 4);
    assert!(a2a.iter().all(|o| o.bytes == 2 * 4096 * 2 * 4096 && o.group == GroupKind::Ep));
    // DeepSeek-V3 under TP 2 (sequence parallel): each GPU dispatches its half of the tokens,
    // 8 copies each; with expert-TP 1 nothing more, with expert-TP 2 the received tokens are
    // all-gathered over the expert-TP pair and the outputs reduce-scattered back.
    let ds = model("deepseek-v3");
    let plan =
        Plan { tp: 2, pp: 8, vpp: 4, dp: 64, ep: 64, etp: Some(1), sp: true, gbs: 8192, ..Plan::default() };
    let ops = layer_comms(&ds, &plan, 10);
    let sent = 2 * 4096 / 2 * 8 * 7168;
    let ep: Vec<_> = ops.iter().filter(|o| o.group == GroupKind::Ep).collect();
    assert_eq!(ep.len(), 4);
    assert!(ep.iter().all(|o| o.kind == CollectiveKind::AllToAll && o.bytes == sent));
    assert!(ops.iter().all(|o| o.group != GroupKind::Etp));
    let ops = layer_comms(&ds, &Plan { etp: None, ..plan }, 10);
    let etp: Vec<_> = ops.iter().filter(|o| o.group == GroupKind::Etp).map(|o| (o.kind, o.bytes)).collect();
    assert_eq!(
        etp,
        [(CollectiveKind::AllGather, 2 * sent), (CollectiveKind::ReduceScatter, 2 * sent)].repeat(2)
    );
    assert!(ops.iter().filter(|o| o.group == GroupKind::Ep).all(|o| o.bytes == sent));
    // ZeRO-1: reduce-scatter of the stage's BF16 gradients in 80 MB buckets, then a gather.
    let plan = Plan { sharding: Sharding::Zero(1), ..llama70_plan() };
    let g = grad_reduces(&m, &plan, 1);
    assert_eq!(g.len(), 1);
    assert_eq!(
        (g[0].kind, g[0].group, g[0].gather_after),
        (CollectiveKind::ReduceScatter, GroupKind::DpCp, true)
    );
    let layer: u64 = 8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672;
    assert_eq!(g[0].bytes, 2 * (20 * layer / 8 + 20 * 2 * 8192));
    assert_eq!(g[0].buckets, g[0].bytes.div_ceil(80_000_000));
}

#[test]
fn analytic_breakdown_adds_up() {
    let plan =
        Plan { vpp: 5, recompute: Recompute::Selective, sharding: Sharding::Zero(1), ..llama70_plan() };
    let e = run("llama3-70b", &plan, "dgx-h100.toml", &simple_comm);
    let b = e.breakdown;
    assert!(rel_err(b.total(), e.step_time_s) < 1e-9, "{b:?} vs {}", e.step_time_s);
    for (what, v) in [
        ("compute", b.compute),
        ("tp", b.tp),
        ("pp", b.pp),
        ("dp", b.dp),
        ("bubble", b.bubble),
        ("opt", b.optimizer),
    ] {
        assert!(v > 0.0, "{what} should be positive: {b:?}");
    }
    assert_eq!((b.cp, b.ep), (0.0, 0.0));
    assert!(rel_err(e.tokens_per_s, 64.0 * 8192.0 / e.step_time_s) < 1e-12);
    assert!(e.mfu > 0.2 && e.mfu < 0.8, "MFU {}", e.mfu);
    assert!(e.hardware_tflops_per_gpu > e.model_tflops_per_gpu);
    assert_eq!(e.memory.stage, 0);
}

#[test]
fn analytic_without_communication_is_compute_bubble_and_optimizer() {
    let plan = Plan { recompute: Recompute::Selective, ..llama70_plan() };
    let free = |_: CollectiveKind, _: u64, _: &[u64]| 0.0;
    let e = run("llama3-70b", &plan, "dgx-h100.toml", &free);
    let b = e.breakdown;
    assert_eq!((b.tp, b.cp, b.ep, b.pp, b.dp), (0.0, 0.0, 0.0, 0.0, 0.0));
    assert!(rel_err(b.compute + b.bubble + b.optimizer, e.step_time_s) < 1e-9);
    // With uniform stages the bubble is close to (p-1)/m of the compute; stage 0's embedding
    // and stage 3's logits make the stages unequal, hence the tolerance.
    let closed = 3.0 / 16.0;
    assert!((b.bubble / b.compute - closed).abs() < 0.05, "{} vs {closed}", b.bubble / b.compute);
}

#[test]
fn analytic_overlap_switches_matter() {
    let base = Plan { recompute: Recompute::Selective, ..llama70_plan() };
    let on = run("llama3-70b", &base, "dgx-h100.toml", &simple_comm);
    let mut off = base.clone();
    off.overlap.grad_reduce = false;
    let off = run("llama3-70b", &off, "dgx-h100.toml", &simple_comm);
    assert!(off.breakdown.dp > on.breakdown.dp, "{:?} vs {:?}", off.breakdown, on.breakdown);
    let mut tp = base.clone();
    tp.overlap.tp_comm = true;
    let tp = run("llama3-70b", &tp, "dgx-h100.toml", &simple_comm);
    assert!(tp.breakdown.tp < on.breakdown.tp);
    // More micro-batches per step: a smaller bubble share.
    let big = run("llama3-70b", &Plan { gbs: 256, ..base.clone() }, "dgx-h100.toml", &simple_comm);
    assert!(big.breakdown.bubble / big.step_time_s < on.breakdown.bubble / on.step_time_s);
}

#[test]
fn analytic_moe_cp_and_fsdp_paths() {
    // Mixtral 8x7B, TP1 EP8 PP4 VP8 on 64 H100 (the MCore README mapping): EP all-to-all.
    let plan = Plan { ep: 8, pp: 4, dp: 16, vpp: 8, gbs: 256, ..Plan::default() };
    let e = run("mixtral-8x7b", &plan, "dgx-h100.toml", &simple_comm);
    assert!(e.breakdown.ep > 0.0 && e.breakdown.tp == 0.0, "{:?}", e.breakdown);
    assert!(rel_err(e.breakdown.total(), e.step_time_s) < 1e-9);
    // Llama-3-8B with CP2 on 8 GPUs (NeMo's mapping): the KV ring hides behind attention,
    // the overlap share still costs something.
    let plan = Plan { cp: 2, dp: 4, gbs: 128, ..Plan::default() };
    let e = run("llama3-8b", &plan, "dgx-h100.toml", &simple_comm);
    assert!(e.breakdown.cp > 0.0, "{:?}", e.breakdown);
    // GPT-3 175B with ZeRO-3 on 384 A100 (Narayanan Table 2 shape): gathers cost time and
    // the weights are sharded 384 ways.
    let plan = Plan {
        dp: 384,
        mbs: 4,
        gbs: 1536,
        sharding: Sharding::Zero(3),
        recompute: Recompute::Full,
        ..Plan::default()
    };
    let e = run("gpt3-175b", &plan, "dgx-a100.toml", &simple_comm);
    assert!(e.memory.params < 2 * 175_000_000_000 / 384 + 1_000_000_000);
    let mut no_prefetch = plan.clone();
    no_prefetch.overlap.param_gather = false;
    let slow = run("gpt3-175b", &no_prefetch, "dgx-a100.toml", &simple_comm);
    assert!(slow.breakdown.dp > e.breakdown.dp + 1.0, "{:?} vs {:?}", slow.breakdown, e.breakdown);
}

/// Line-rate bandwidth model of an A100 node: 300 GB/s NVLink at NCCL's ~0.8 payload
/// share, 200 Gb/s HDR per GPU between nodes at 0.9.
fn a100_comm(kind: CollectiveKind, bytes: u64, ranks: &[u64]) -> f64 {
    let n = ranks.len() as f64;
    let one_node = ranks.iter().all(|r| r / 8 == ranks[0] / 8);
    let bw = if one_node { 300e9 * 0.8 } else { 25e9 * 0.9 };
    let factor = match kind {
        CollectiveKind::AllReduce => 2.0 * (n - 1.0) / n,
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => (n - 1.0) / n,
        CollectiveKind::SendRecv => 1.0,
    };
    10e-6 + factor * bytes as f64 / bw
}

#[test]
fn fp8_on_a_gpu_without_it_names_the_dtype() {
    let plan = Plan { tp: 8, gbs: 1, dtype: fabricsim::workload::plan::Dtype::Fp8, ..Plan::default() };
    let g = gpu("dgx-a100.toml");
    let params = GpuParams::for_generation(g.generation).unwrap();
    let e = estimate(&model("llama3-8b"), &plan, &g, params, &simple_comm).unwrap_err();
    assert!(e.contains("`dtype`") && e.contains("valid: bf16"), "{e}");
}

#[test]
fn fitted_runs_reproduce_their_published_numbers() {
    use fabricsim::workload::plan::Dtype;
    // The three runs src/workload/gpu_params.toml was fitted on (`calibrate --training
    // --from-reference`), with the collectives simulated on the shipped topology as the fit
    // and `validate --training` price them; the MFU is a check of the FLOP count, which
    // played no part in the fit.
    // The 22B run is Megatron of 2022: unfused attention (validate/reference/training_runs.csv).
    let plan = Plan {
        tp: 8,
        dp: 1,
        mbs: 4,
        gbs: 4,
        sp: true,
        recompute: Recompute::Selective,
        attention: fabricsim::workload::plan::Attention::Unfused,
        ..Plan::default()
    };
    let (e, _) = step_on_fabric(&built("dgx-a100", 1), &model("megatron-gpt-22b"), &plan).unwrap();
    assert!(rel_err(e.step_time_s, 1.10) < 0.01, "22B: {} s", e.step_time_s);
    assert!((e.mfu - 0.415).abs() < 0.01, "22B MFU {}", e.mfu);
    let plan = Plan { tp: 8, dp: 96, gbs: 384, sp: true, sharding: Sharding::Zero(1), ..Plan::default() };
    // Published in February 2024, before NCCL 2.23 brought PAT: its one-GPU-per-node DP
    // collectives ran as rings (training_runs.csv's `nccl` column).
    let (no_pat, _) =
        fabricsim::scenario::nccl_env::training_policy(&[("NCCL_ALGO".into(), "^PAT".into())]).unwrap();
    let (e, _) =
        step_on_fabric_with(&built("dgx-h100", 96), &model("nemotron4-15b"), &plan, &no_pat).unwrap();
    assert!(rel_err(e.step_time_s, 0.57) < 0.01, "15B: {} s", e.step_time_s);
    assert!((e.mfu - 0.343).abs() < 0.01, "15B MFU {}", e.mfu);
    let plan = Plan { dp: 8, gbs: 128, sharding: Sharding::Zero(1), dtype: Dtype::Fp8, ..Plan::default() };
    let (e, _) = step_on_fabric(&built("dgx-h100", 1), &model("llama2-7b"), &plan).unwrap();
    assert!(rel_err(e.model_tflops_per_gpu, 780.0) < 0.01, "7B FP8: {} TFLOP/s", e.model_tflops_per_gpu);
}

#[test]
fn runs_not_fitted_on_are_within_15_percent() {
    use fabricsim::workload::plan::Dtype;
    // Published runs that played no part in the fit (TRAINING_BENCH.md Sec. 1 and 5.1), with
    // the 15% bound of issue 9. The analytical model with a line-rate bandwidth model, not
    // fabricsim's collective simulator; errors when written: -4.5% to +6%, and -11% for the
    // Megatron 145.6B row. Korthikanti's 175B and 530B runs (Table 5) are not here: the
    // estimate is 17% and 36% slow on them (see the lead's report).
    let mut cases: Vec<(&str, f64, f64)> = Vec::new();
    // Narayanan et al. Table 1: hardware TFLOP/s with full recomputation (MBS not stated;
    // taken as 1).
    for (name, tp, pp, gpus, gbs, published) in [
        ("megatron-gpt-1.7b", 1, 1, 32, 512, 137.0),
        ("megatron-gpt-7.5b", 4, 1, 128, 512, 142.0),
        ("megatron-gpt-39.1b", 8, 2, 512, 1536, 138.0),
        ("megatron-gpt-145.6b", 8, 8, 1536, 2304, 148.0),
    ] {
        let plan = Plan {
            tp,
            pp,
            dp: gpus / (tp * pp),
            gbs,
            recompute: Recompute::Full,
            attention: fabricsim::workload::plan::Attention::Unfused,
            ..Plan::default()
        };
        cases.push((name, run(name, &plan, "dgx-a100.toml", &a100_comm).hardware_tflops_per_gpu, published));
    }
    // NeMo 24.07, H100 FP8: model TFLOP/s per GPU.
    let fp8 = |tp, pp, cp, vpp, dp, gbs| Plan {
        tp,
        pp,
        cp,
        vpp,
        dp,
        gbs,
        sp: tp > 1,
        sharding: Sharding::Zero(1),
        dtype: Dtype::Fp8,
        ..Plan::default()
    };
    for (name, plan, published) in [
        ("llama3-8b", fp8(1, 1, 2, 1, 4, 128), 711.0),
        ("llama3-70b", fp8(4, 4, 2, 5, 2, 128), 734.0),
        ("gpt3-175b", fp8(4, 8, 1, 6, 4, 256), 771.0),
        ("nemotron4-340b", fp8(8, 8, 1, 12, 2, 32), 686.0),
    ] {
        cases.push((name, run(name, &plan, "dgx-h100.toml", &simple_comm).model_tflops_per_gpu, published));
    }
    for (name, got, published) in cases {
        assert!(rel_err(got, published) < 0.15, "{name}: {got:.0} TFLOP/s vs published {published}");
    }
}

// ---------------------------------------------------------------- accuracy table

#[test]
fn published_training_runs_out_of_sample() {
    use fabricsim::calibrate::training::{load_training_runs, score_training, training_runs_path, Use};
    // validate/reference/training_runs.csv: every run the file holds, collectives simulated
    // on the shipped topology (the table of README.md, "Training steps").
    let runs = load_training_runs(&training_runs_path(&root())).unwrap();
    assert!(runs.len() >= 30, "{} runs", runs.len());
    assert_eq!(
        runs.iter().filter(|r| r.use_ == Use::Fitted).count(),
        3,
        "three fitted runs, one per constant"
    );
    // Megatron-Bridge's model TFLOP/s come from a formula of its own (causal attention at
    // half, changing between releases: 449 then 439 GFLOP a token for Llama 3 70B at 8,192
    // against this crate's 481.6): its runs are compared in the tokens/s/GPU they measured.
    use fabricsim::calibrate::training::Metric;
    for r in runs.iter().filter(|r| r.source.contains("Megatron-Bridge")) {
        assert_eq!(r.metric, Metric::TokensPerGpu, "{}", r.run);
    }
    let s = score_training(&root(), None).unwrap();
    // Every run of the file is scored (Mixtral's once deadlocked: a relabel bug, fixed).
    assert!(s.uncovered.is_empty(), "{:?}", s.uncovered);
    // Each of them ran, so each fits its GPUs by the memory estimate (the fullest when
    // written: Nemotron-4 340B in FP8, 73.4 of 74.5 GiB).
    for r in &s.rows {
        assert!(r.memory <= r.hbm, "{} needs {} of {} bytes", r.run.run, r.memory, r.hbm);
    }
    for r in &s.rows {
        let name = r.run.run.as_str();
        let e = r.error.abs();
        match r.run.use_ {
            Use::Fitted => assert!(
                e < 0.01,
                "fitted {name}: {:+.1}% (rerun `fabricsim calibrate --training --from-reference --write-params`)",
                r.error * 100.0
            ),
            // The last to come in: Narayanan et al.'s DeepSpeed ZeRO-3 runs of GPT-3 175B
            // (+30/+108/+297% while their weights were gathered a layer at a time: their
            // `gather_unit` is now DeepSpeed's own), then those of the 529.6B model (+16.5%,
            // +25.1% at 1,120 and 2,240 GPUs until their protocols were picked by NCCL 2.8's
            // tuner, the NCCL they ran: +12.3%, +14.8%).
            Use::HeldOut => assert!(e < 0.15, "held-out {name}: {:+.1}%", r.error * 100.0),
        }
    }
    assert!(
        // 7.1% on 2026-12-02 since the 2021-22 Megatron runs are timed with the unfused
        // attention they ran (11.0% before, 15.2% with it but Ampere's GEMM constant
        // unrefitted); 7.2% over 29 runs with the two added ZeRO-3 rows (7.0% over the 27);
        // 7.1% over 30 with Megatron-Bridge's FSDP run; 5.3% over 31 with the recipes' TP
        // overlap and the Llama 3.1 405B run, and over 33 with its GB200 and B200 runs;
        // 4.8% over 34 on 2026-12-05 with the three GPT-3 ZeRO-3 runs within 15%, 5.6% over
        // 37 with the 529.6B model's three ZeRO-3 runs added, 4.7% once Narayanan et al.'s
        // runs took NCCL 2.8's tuner (`NCCL_VERSION=2.8`).
        s.median_held_out < 0.05,
        "median |error| of every held-out run: {:.1}%",
        s.median_held_out * 100.0
    );
    assert!(s.median_fitted < 0.02, "median |error| of the fitted runs: {:.1}%", s.median_fitted * 100.0);
    // The README's table is this one: each run's line ends with today's error and use.
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for r in &s.rows {
        let head = format!("| {} |", r.run.run);
        let line =
            readme.lines().find(|l| l.starts_with(&head)).unwrap_or_else(|| panic!("README lacks {head}"));
        let u = if r.run.use_ == Use::Fitted { "fitted" } else { "held_out" };
        let tail = format!("| {:+.1}% | {u} |", r.error * 100.0);
        assert!(line.ends_with(&tail), "README's row is stale: {line} (now {tail})");
    }
}

#[test]
fn validate_training_prints_the_table() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["validate", "--training", "--format", "markdown"])
        .current_dir(root())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.starts_with("| run | model | GPUs | topology | metric | published | simulated | error | use |")
    );
    assert!(
        text.contains("| nemo2407-llama2-7b-fp8 | llama2-7b | 8 | dgx-h100 | model TFLOP/s/GPU | 780 |"),
        "{text}"
    );
    assert!(
        text.contains("median |error|: held-out ") && text.contains("| mcore08-mixtral-8x7b |"),
        "{text}"
    );
}

/// `validate --training` adds the event-mode column for runs within the rule (here the two
/// 8-GPU GPT-22B runs of Korthikanti et al.), and says which runs it does not simulate and
/// why, with the median error of both modes on the simulated runs.
#[test]
fn validate_training_has_an_event_column() {
    let cli = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
            .args(["validate", "--training", "--format", "markdown", "--filter", "korthikanti22-gpt22b"])
            .args(extra)
            .current_dir(root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let text = cli(&[]);
    assert!(text.starts_with("| run | model | GPUs | topology | metric | published | simulated | error | use | event | event error |"), "{text}");
    let row = text.lines().find(|l| l.starts_with("| korthikanti22-gpt22b-full |")).unwrap();
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | run | model | GPUs | topology | metric | published | simulated | error | use | event | event error |
    let (analytic, event): (f64, f64) =
        (cells[8].trim_end_matches('%').parse().unwrap(), cells[11].trim_end_matches('%').parse().unwrap());
    // One GPU group, no pipeline, no data parallelism: both modes time the same TP step.
    assert!((analytic - event).abs() <= 1.0, "{row}");
    assert!(
        text.contains("event mode (runs of at most 4096 GPUs") && text.contains("on the same 2 runs"),
        "{text}"
    );
    let small = cli(&["--event-max-gpus", "4"]);
    assert!(small.contains("| too slow | - |"), "{small}");
    assert!(
        small.contains("korthikanti22-gpt22b-full: too slow to simulate here: 8 GPUs (rule: at most 4)"),
        "{small}"
    );
    let off = cli(&["--event-max-gpus", "0"]);
    assert!(!off.contains("event"), "{off}");
}

// ---------------------------------------------------------------- event-mode step

use fabricsim::collective::{Algo, NcclPolicy};
use fabricsim::fabric::build::{build, BuildOpts};
use fabricsim::fabric::Fabric;
use fabricsim::workload::concurrent::{step_on_fabric, step_on_fabric_with};
use fabricsim::workload::lower::{step_event, step_event_with, EventOpts, StepJob, StepJobKind};
use fabricsim::workload::search::FabricPricer;

fn built(topology: &str, nodes: u32) -> Fabric {
    let spec = load_topology(&root().join("topologies").join(format!("{topology}.toml"))).unwrap();
    build(&spec, &BuildOpts { nodes: Some(nodes), gpus_per_node: None, params: None }).unwrap()
}

fn plan_text(m: &Model, gpus: u64, text: &str) -> Plan {
    parse_plan(text, Path::new("<test>"), m, gpus).unwrap()
}

/// The step time of `plan` in the event mode and in the closed form, in seconds.
fn event_and_closed_form(f: &Fabric, m: &Model, plan: &Plan) -> (f64, f64) {
    let (a, _) = step_on_fabric(f, m, plan).unwrap();
    let e = step_event(f, m, plan, &EventOpts::default()).unwrap();
    (e.estimate.step_time_s, a.step_time_s)
}

/// A calibration profile's (or a topology's) `[params.compute]` replaces the generation's
/// compute constants: with the GEMM, attention and HBM efficiencies halved, every kernel of a
/// one-GPU step (no collective) takes exactly twice as long, and so does the step.
#[test]
fn a_profile_overrides_the_compute_constants() {
    let spec = load_topology(&root().join("topologies/dgx-h100.toml")).unwrap();
    let shipped = GpuParams::for_generation(spec.gpu.generation).unwrap();
    let compute: toml::Table = toml::from_str(&format!(
        "gemm_eff = {}\nattention_eff = {}\nhbm_eff = {}",
        shipped.gemm_eff / 2.0,
        shipped.attention_eff / 2.0,
        shipped.hbm_eff / 2.0
    ))
    .unwrap();
    let profile = toml::Table::from_iter([("compute".to_string(), toml::Value::Table(compute))]);
    let f = build(&spec, &BuildOpts { nodes: Some(1), gpus_per_node: None, params: Some(profile) }).unwrap();
    let slow = GpuParams::for_fabric(&f).unwrap();
    assert_eq!(slow.gemm_eff, shipped.gemm_eff / 2.0);
    assert_eq!((slow.gemm_eff_fp8, slow.overlap_slowdown), (shipped.gemm_eff_fp8, shipped.overlap_slowdown));
    let plan = Plan { gbs: 2, ..Plan::default() };
    let none = |_: CollectiveKind, _: u64, _: &[u64]| 0.0;
    let m = model("llama3-8b");
    let a = estimate(&m, &plan, &f.gpu, shipped, &none).unwrap();
    let b = estimate(&m, &plan, &f.gpu, slow, &none).unwrap();
    assert!(rel_err(b.step_time_s, 2.0 * a.step_time_s) < 1e-9, "{} s vs {} s", b.step_time_s, a.step_time_s);
    // The same through `train --calibration`, and a bad value located in the profile.
    let dir = std::env::temp_dir().join(format!("fabricsim-compute-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, format!("[params.compute]\ngemm_eff = {}\n", shipped.gemm_eff / 2.0)).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "# too fast\n[params.compute]\nattention_eff = 1.2\n").unwrap();
    let train = |profile: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
            .current_dir(root())
            .args(["train", "--model", "models/llama3-8b.toml", "--topology", "topologies/dgx-h100.toml"])
            .args([
                "--nodes", "1", "--dp", "8", "--gbs", "16", "--zero", "1", "--seq", "4096", "--format",
                "json",
            ])
            .arg("--calibration")
            .arg(profile)
            .output()
            .unwrap()
    };
    let out = train(&good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = v["step_time_s"].as_f64().unwrap();
    let shipped_plan =
        Plan { dp: 8, gbs: 16, seq: Some(4096), sharding: Sharding::Zero(1), ..Plan::default() };
    let (c, _) = step_on_fabric(&built("dgx-h100", 1), &m, &shipped_plan).unwrap();
    assert!(t > 1.5 * c.step_time_s, "{t} s with gemm_eff halved, {} s shipped", c.step_time_s);
    let out = train(&bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml:3:") && err.contains("compute.attention_eff"), "{err}");
    // `plan` searches under the profile too: its best plan is slower than the shipped best.
    let best = |profile: Option<&Path>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"));
        c.current_dir(root())
            .args(["plan", "--model", "models/llama3-8b.toml", "--topology", "topologies/dgx-h100.toml"])
            .args(["--gpus", "8", "--gbs", "16", "--seq", "4096", "--top", "1", "--format", "json"]);
        if let Some(p) = profile {
            c.arg("--calibration").arg(p);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v[0]["candidates"][0]["step_time_s"].as_f64().unwrap()
    };
    let (shipped_best, slow_best) = (best(None), best(Some(&good)));
    assert!(slow_best > 1.5 * shipped_best, "{slow_best} s vs {shipped_best} s");
    std::fs::remove_dir_all(&dir).ok();
}

/// Event mode against the analytical mode on small plans. Tolerance 6%: both price TP, CP
/// and EP the same way (memoized collectives, same exposure rules) and use the same compute
/// times; they differ where the event mode is meant to differ: pipeline transfers and DP
/// buckets contend with each other on the links, the SM slowdown is charged for the overlap
/// the run shows (the analytical mode charges none for DP overlap), DP buckets number at most
/// 16 and become ready kernel by kernel, and repeated collectives run as rings where NCCL
/// would use SHARP (a simulator limitation, see `workload::lower`). On the plans below the two agree within 3%; 6% leaves room for those effects, and a lowering error (a missing
/// dependency, a dropped op, a double-counted pass) moves a step by far more.
#[test]
fn event_mode_agrees_with_the_analytical_mode() {
    let m = model("llama3-8b");
    let cases = [
        ("dgx-h100", 2, "tp = 8\ndp = 2\nmbs = 1\ngbs = 8\nseq = 2048\n"),
        ("dgx-h100", 2, "tp = 4\npp = 2\ndp = 2\nmbs = 1\ngbs = 8\nseq = 2048\nschedule = \"1f1b\"\n"),
        ("dgx-h100", 2, "tp = 2\npp = 4\nvpp = 2\ndp = 2\nmbs = 1\ngbs = 8\nseq = 2048\n"),
        ("dgx-a100", 2, "tp = 4\npp = 4\nmbs = 1\ngbs = 8\nseq = 2048\nschedule = \"gpipe\"\n"),
        // Uneven layouts: 32 layers over 12 chunks (balanced: 2 or 3 per chunk), and
        // Megatron's explicit first/last stage sizes (5, 9, 9, 9).
        ("dgx-h100", 2, "tp = 2\npp = 4\nvpp = 3\ndp = 2\nmbs = 1\ngbs = 8\nseq = 2048\n"),
        (
            "dgx-h100",
            2,
            "tp = 4\npp = 4\nmbs = 1\ngbs = 8\nseq = 2048\ndecoder_first_pipeline_num_layers = 5\n",
        ),
        // An MTP layer on the last stage.
        ("dgx-h100", 2, "tp = 4\npp = 4\nmbs = 1\ngbs = 8\nseq = 2048\nmtp_num_layers = 1\n"),
    ];
    for (topo, nodes, text) in cases {
        let f = built(topo, nodes);
        let plan = plan_text(&m, f.num_gpus() as u64, text);
        let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
        let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
        let err = rel_err(e.estimate.step_time_s, a.step_time_s);
        assert!(
            err < 0.06,
            "{topo} {text:?}: event {:.4} s vs analytical {:.4} s ({:+.1}%)",
            e.estimate.step_time_s,
            a.step_time_s,
            err * 100.0
        );
        // The breakdown adds up to the step, and compute is the analytical mode's.
        let b = e.estimate.breakdown;
        assert!(
            rel_err(b.total(), e.estimate.step_time_s) < 1e-6,
            "{text:?}: {b:?} {} {}",
            e.estimate.step_time_s,
            a.step_time_s
        );
        assert!(rel_err(b.compute, a.breakdown.compute) < 1e-9, "{text:?}");
    }
}

/// ZeRO-3 weight gathers and gradient reduce-scatters, layer by layer, in the analytical
/// mode as in the event mode: each priced at one layer's size (not one collective of the
/// whole chunk, whose latency and NCCL pick differ), and hidden for as long as the layer
/// runs, exposed CP exchanges on NVLink included. Llama 3 8B on 64 DGX H100 nodes, TP 1 CP 8
/// DP 64: every layer's gather runs on all 512 ranks and outlasts the layer's forward; the
/// analytical step was 47% below the event mode's (1.82 s against 3.45 s) when it priced one
/// gather per chunk. Llama 3 70B on 16 nodes, CP 8 DP 16: the gathers hide under the CP
/// exchanges the step waits for; counted behind compute alone the analytical step was 10.6%
/// above. Measured: +0.3% and -1.9% (2026-12-05; +3.3% and -1.4% while the closed form
/// added the SM share of gathers that outlast their layer on top of them).
#[test]
fn zero3_gathers_are_priced_layer_by_layer_in_both_modes() {
    let cases = [
        (
            "llama3-8b",
            64,
            "tp = 1\ncp = 8\ndp = 64\nzero = 3\nmbs = 1\ngbs = 512\nseq = 8192\nrecompute = \"none\"\n",
        ),
        (
            "llama3-70b",
            16,
            "tp = 1\ncp = 8\ndp = 16\nzero = 3\nmbs = 1\ngbs = 64\nseq = 8192\nrecompute = \"none\"\n",
        ),
    ];
    for (name, nodes, text) in cases {
        let m = model(name);
        let f = built("superpod-h100", nodes);
        let plan = plan_text(&m, f.num_gpus() as u64, text);
        let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
        let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
        let err = rel_err(a.step_time_s, e.estimate.step_time_s);
        assert!(
            err < 0.05,
            "{name} {text:?}: analytical {:.3} s vs event {:.3} s ({:+.1}%)",
            a.step_time_s,
            e.estimate.step_time_s,
            100.0 * (a.step_time_s / e.estimate.step_time_s - 1.0)
        );
        // The gathers are what is exposed: neither mode hides them entirely.
        assert!(
            a.breakdown.dp > 0.05 * a.step_time_s && e.estimate.breakdown.dp > 0.05 * e.estimate.step_time_s
        );
    }
}

/// ZeRO-3: both modes gather weights and reduce-scatter gradients layer by layer, hidden
/// under compute that slows by the SM share, with the step's first gather and each stage's
/// last reduce-scatter exposed. They once differed by 13%: the event mode gathered a whole
/// chunk's weights before each op (the first exposed in full, the next overlapping the
/// previous op's reduce-scatter) and let the optimizer run before the last reduce-scatter,
/// and the analytical mode hid every gather behind its own op and charged no SM share.
/// Bound: 2% where compute hides the communication (measured: within 0.5%). Where it does
/// not (TP 8 leaves little compute per layer for a 2-node gather), 0.301 s in both since
/// the closed form stopped adding the SM share of gathers that outlast their layers on top
/// of them (2026-12-05; 0.314 s before, 4%; 19% when the closed form added a layer's
/// gathers and reduce-scatters one after the other, which the event mode runs two or three
/// at a time sharing the links): bound 2% for all three.
#[test]
fn zero3_gather_waits_are_dp_in_both_modes_beside_cp() {
    // GPT 22B, tp 8 cp 2 dp 1 on two DGX A100, ZeRO-3 without prefetch: the weight gathers
    // (over dp x cp, across the nodes) are exposed. The event mode put the wait of each op
    // with CP shadows on CP (9.6 s of CP against 0.3 s in the closed form, found by fuzzing
    // `train`); both modes now say where the time goes alike.
    let m = model("megatron-gpt-22b");
    let f = built("dgx-a100", 2);
    let text = "tp = 8\ncp = 2\ndp = 1\nzero = 3\nmbs = 1\ngbs = 4\nseq = 2048\nrecompute = \"selective\"\n\
                overlap_param_gather = false\n";
    let plan = plan_text(&m, 16, text);
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap().estimate;
    for (mode, b) in [("analytical", &a.breakdown), ("event", &e.breakdown)] {
        assert!(b.dp > 10.0 * b.cp, "{mode}: dp {} s, cp {} s", b.dp, b.cp);
    }
    assert!(rel_err(e.breakdown.cp, a.breakdown.cp) < 0.25, "cp {} vs {}", e.breakdown.cp, a.breakdown.cp);
}

#[test]
fn zero3_event_and_analytical_modes_agree() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 2);
    for (text, bound) in [
        ("tp = 1\ndp = 16\nzero = 3\nmbs = 1\ngbs = 64\nseq = 2048\n", 0.02),
        ("tp = 2\npp = 2\ndp = 4\nzero = 3\nmbs = 1\ngbs = 16\nseq = 2048\n", 0.02),
        ("tp = 8\ndp = 2\nzero = 3\nmbs = 1\ngbs = 8\nseq = 2048\n", 0.02),
    ] {
        let plan = plan_text(&m, 16, text);
        let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
        let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
        let err = rel_err(e.estimate.step_time_s, a.step_time_s);
        assert!(
            err < bound,
            "{text:?}: event {:.4} s vs analytical {:.4} s ({:+.1}%)",
            e.estimate.step_time_s,
            a.step_time_s,
            err * 100.0
        );
        // The optimizer waits for the last reduce-scatter of its stage.
        let opt = e.jobs.iter().find(|j| j.kind == StepJobKind::Optimizer && j.stage == 0).unwrap();
        let last_rs = e
            .jobs
            .iter()
            .filter(|j| j.stage == 0 && j.name.starts_with("fsdp reduce-scatter"))
            .map(|j| j.end)
            .max()
            .unwrap();
        // (The optimizer waits for its own rank's part of the ring, which may end up to a
        // network step, tens of microseconds, before the last rank's; an optimizer that did
        // not wait would start milliseconds early.)
        assert!(
            opt.start.as_secs() >= last_rs.as_secs() - 1e-4,
            "{text:?} {opt:?}: starts at {:.6} s, the last reduce-scatter ends at {:.6} s",
            opt.start.as_secs(),
            last_rs.as_secs()
        );
    }
}

/// `gather_unit`: ZeRO-3 weights gathered (and gradients reduce-scattered) one NCCL call per
/// parameter tensor, and through PyTorch's list API one copy per rank and call, as
/// DeepSpeed's first ZeRO-3 did. Without `overlap_param_gather` every such collective is on
/// the critical path, so what the list API adds is a closed form: each of a layer's calls
/// (six tensors of a Llama layer: two norm scales, QKV, the projection, fc1, fc2) copies
/// its bytes in one piece per rank, so a step pays, per layer pass (a forward gather, a
/// backward gather, a reduce-scatter, each micro-batch), calls x ranks x the copy floor
/// plus the layer's bytes read and written once. Each call pays its own latency, so
/// per-tensor calls cost more than one per layer. The event mode agrees with the closed form.
#[test]
fn zero3_gather_unit_prices_each_tensor_and_each_ranks_copy() {
    use fabricsim::workload::comm::chunk_gathers;
    use fabricsim::workload::compute::{GpuParams, Roofline};
    let m = model("llama3-8b");
    let f = built("dgx-h100", 2);
    let base = "tp = 1\ndp = 16\nzero = 3\nmbs = 1\ngbs = 32\nseq = 2048\noverlap_param_gather = false\n";
    let step = |unit: &str| {
        let plan = plan_text(&m, 16, &format!("{base}gather_unit = \"{unit}\"\n"));
        let (e, a) = event_and_closed_form(&f, &m, &plan);
        assert!(rel_err(e, a) < 0.01, "{unit}: event {e:.4} s vs analytical {a:.4} s");
        (plan, a)
    };
    let (layer_plan, layer) = step("layer");
    let (plan, tensor) = step("tensor");
    let (_, list) = step("tensor_list");
    assert!(layer < tensor && tensor < list, "{layer} {tensor} {list}");
    let one = chunk_gathers(&m, &layer_plan, 0, 0);
    let calls = &chunk_gathers(&m, &plan, 0, 0)[0].calls;
    assert_eq!(calls.len(), 6, "{calls:?}");
    assert_eq!(one[0].calls.len(), 1);
    let layer_bytes: u64 = calls.iter().sum();
    assert_eq!(layer_bytes, one[0].calls[0], "the tensors share the layer's bytes exactly");
    let r = Roofline::new(&f.gpu, plan.dtype, GpuParams::for_fabric(&f).unwrap()).unwrap();
    let passes = (3 * m.layers * plan.microbatches()) as f64;
    let copies = 6.0 * 16.0 * r.params.copy_floor_us * 1e-6 + r.memory_time(2.0 * layer_bytes as f64);
    let want = passes * copies;
    assert!(rel_err(list - tensor, want) < 1e-6, "list - tensor = {:.6} s, want {want:.6} s", list - tensor);
    // Sharded weights only: the key is refused elsewhere, and the event mode's replay is
    // what prices a layer's calls one by one.
    let e = parse_plan("tp = 1\ndp = 16\nzero = 1\ngather_unit = \"tensor\"\n", Path::new("p.toml"), &m, 16)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.toml:4:") && e.contains("gather_unit") && e.contains("zero = 3 or fsdp"), "{e}");
    let e = parse_plan("zero = 3\ngather_unit = \"bucket\"\n", Path::new("p.toml"), &m, 16)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("p.toml:2:") && e.contains("layer, tensor, tensor_list"), "{e}");
    let no_replay = EventOpts { replay: false, ..EventOpts::default() };
    let e = step_event(&f, &m, &plan, &no_replay).unwrap_err();
    assert!(e.contains("--no-replay") && e.contains("gather_unit"), "{e}");
}

/// 1F1B with compute only on the critical path: the pipeline's end in the event run is the
/// dependency timer of `pipeline.rs` fed with the same op times and the measured transfer
/// times, to the picosecond rounding of the kernels; and the idle share is the closed form
/// (p-1)/m up to what the transfers add.
#[test]
fn one_f_one_b_bubble_emerges_from_the_dependencies() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 1);
    // TP 1: no TP collectives; DP 1: no gradient reduction; pipeline transfers overlap.
    let plan = plan_text(
        &m,
        8,
        "tp = 1\npp = 8\nmbs = 1\ngbs = 16\nseq = 1024\nschedule = \"1f1b\"\npp_comm_overlap = true\n",
    );
    let e = step_event(&f, &m, &plan, &EventOpts { sm_slowdown: false, ..EventOpts::default() }).unwrap();
    let sched = PipelineSchedule::build(Schedule::OneFOneB, 8, 1, 16).unwrap();
    let op_time = |s: u32, o: &fabricsim::workload::pipeline::PipeOp| -> f64 {
        let name = format!("stage {s} {:?} mb {} chunk {}", o.pass, o.mb, o.chunk);
        let j = e.jobs.iter().find(|j| j.name == name).unwrap();
        (j.end - j.start).as_secs()
    };
    let pp_jobs: Vec<f64> =
        e.jobs.iter().filter(|j| j.kind == StepJobKind::Pp).map(|j| (j.end - j.start).as_secs()).collect();
    assert_eq!(pp_jobs.len(), 2 * 7 * 16, "one transfer per micro-batch, boundary and direction");
    let p2p = pp_jobs.iter().sum::<f64>() / pp_jobs.len() as f64;
    let spread = pp_jobs.iter().map(|t| (t - p2p).abs()).fold(0.0, f64::max);
    assert!(spread < 1e-3 * p2p, "uncontended transfers take one time: {spread} vs {p2p}");
    let t = sched.time(op_time, |_, _| p2p).unwrap();
    let pipe_end =
        e.jobs.iter().filter(|j| j.kind == StepJobKind::Compute).map(|j| j.end.as_secs()).fold(0.0, f64::max);
    let ops = 2.0 * 16.0 * 8.0;
    assert!(
        (pipe_end - t.makespan).abs() < ops * 2e-12 + 1e-3 * p2p * ops,
        "event {pipe_end} s vs timer {} s",
        t.makespan
    );
    // The bubble of the breakdown is the timer's without transfers (the stages are not
    // uniform: embedding on the first, logits on the last, so not exactly (p-1)/m).
    let ideal = sched.time(op_time, |_, _| 0.0).unwrap();
    let b = e.estimate.breakdown;
    let busy = ideal.busy.iter().cloned().fold(0.0, f64::max);
    assert!(rel_err(b.bubble, ideal.makespan - busy) < 1e-9, "{b:?}");
}

/// Two DP gradient reductions on groups whose GPUs share a NIC (the PCIe box: four GPUs per
/// NIC) take longer together than either alone, and longer than on separate NICs.
#[test]
fn dp_groups_sharing_a_nic_contend() {
    use fabricsim::collective::{CollArgs, Collective, Knobs};
    use fabricsim::exec::simulate::SimOpts;
    use fabricsim::fabric::Router;
    use fabricsim::schedule::{DType, RedOp};
    use fabricsim::workload::concurrent::{CollectiveJob, Concurrent};
    let f = built("pcie-8gpu", 2);
    let router = Router::new(&f, 0);
    let args = CollArgs {
        coll: Collective::AllReduce,
        count: 32 << 20,
        dtype: DType::BF16,
        redop: RedOp::Sum,
        root: 0,
    };
    let job = |name: &str, ranks: Vec<u32>| CollectiveJob {
        name: name.into(),
        ranks,
        args,
        choice: None,
        knobs: Knobs::default(),
    };
    let time = |groups: Vec<Vec<u32>>| {
        let mut w = Concurrent::new(&f, &router);
        for (i, g) in groups.into_iter().enumerate() {
            w.add(job(&format!("dp {i}"), g)).unwrap();
        }
        w.run(&SimOpts::default()).unwrap().sim.time.as_secs()
    };
    let alone = time(vec![vec![0, 8]]);
    let same_nic = time(vec![vec![0, 8], vec![1, 9]]);
    let other_nic = time(vec![vec![0, 8], vec![4, 12]]);
    assert!(same_nic > 1.15 * alone, "sharing a NIC: {same_nic} s vs alone {alone} s");
    assert!(other_nic < same_nic, "separate NICs: {other_nic} s vs shared {same_nic} s");
}

/// DP gradient reduction overlapped with the last backward exposes less than the reduction
/// takes; without overlap it exposes all of it.
#[test]
fn overlapped_dp_reduction_exposes_less_than_it_takes() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 2);
    let text = "tp = 8\ndp = 2\nmbs = 1\ngbs = 4\nseq = 2048\n";
    let on = plan_text(&m, 16, text);
    let off = plan_text(&m, 16, &format!("{text}overlap_grad_reduce = false\n"));
    let opts = EventOpts { sm_slowdown: false, ..EventOpts::default() };
    let (e_on, e_off) = (step_event(&f, &m, &on, &opts).unwrap(), step_event(&f, &m, &off, &opts).unwrap());
    let reduce = |e: &fabricsim::workload::lower::EventStep| -> f64 {
        e.jobs.iter().filter(|j| j.kind == StepJobKind::Dp).map(|j| (j.end - j.start).as_secs()).sum()
    };
    let (r_on, r_off) = (reduce(&e_on), reduce(&e_off));
    assert!(r_on > 0.0 && r_off > 0.0);
    assert!(
        e_on.estimate.breakdown.dp < 0.5 * r_on,
        "overlapped: exposed {} s of {} s",
        e_on.estimate.breakdown.dp,
        r_on
    );
    // Without overlap the buckets go at once after the backward: the tail is the longest of
    // them (they share the links), at least the time of the reduction alone.
    let longest =
        e_off.jobs.iter().filter(|j| j.kind == StepJobKind::Dp).map(|j| (j.end - j.start).as_secs());
    let longest = longest.fold(0.0, f64::max);
    assert!(e_off.estimate.breakdown.dp >= longest * 0.99, "{} vs {longest}", e_off.estimate.breakdown.dp);
    assert!(e_on.estimate.step_time_s < e_off.estimate.step_time_s);
}

#[test]
fn event_mode_is_deterministic_and_names_bad_input() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 1);
    let plan = plan_text(&m, 8, "tp = 2\npp = 2\ndp = 2\nmbs = 1\ngbs = 4\nseq = 1024\n");
    let a = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let b = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    assert_eq!(a, b);
    let err = step_event(&f, &m, &plan, &EventOpts { max_buckets: 0, ..EventOpts::default() }).unwrap_err();
    assert!(err.contains("max_buckets"), "{err}");
    let too_big = Plan { dp: 4, ..plan };
    let err = step_event(&f, &m, &too_big, &EventOpts::default()).unwrap_err();
    assert!(err.contains("16") || err.contains("GPUs"), "{err}");
}

/// The replay of DP and ZeRO-3/FSDP collectives (`EventOpts::replay`, the default: each
/// distinct collective, by kind, bytes and group shape, simulated once alone and replayed
/// on a proxy rank of its stage, with a NIC shadow at the representative) against
/// simulating every one of them on all its ranks in the composed step, on plans of 64 to
/// 128 GPUs where both run. The shadow (the same collective on the representative and its
/// next peer on another node, moving the bytes the real one moves through that NIC,
/// stretched to its time) is what the pipeline transfers contend with: without it the
/// replay was 6.4% fast on tp4 pp4 vpp2 dp8 (exposed PP 2 ms against 11 ms: DP buckets
/// reduced during the backward share the representative's NIC with the backward
/// transfers). Measured with it: +0.24%, +0.77%, +0.33%, +0.01% (dp 2: the shadow is the
/// real collective); +0.51%, +2.14%, +0.05%, +0.01% since CollNet's chunks follow NCCL's
/// halving rule (the second plan's DP buckets run on CollNet: the full simulation gained
/// 2.0% from the smaller chunks, the replay 0.7%, with each bucket's NIC shadow moving
/// the buffer once each way as an in-switch all-reduce does; what the replay misses there
/// is not isolated); +0.59%, +3.04%, +0.87%, +0.01% since Hopper's GEMM constant was
/// refitted on the simulated step (2026-12-03: compute 13% shorter, so the second plan's
/// CollNet buckets, where the replay is fast, weigh more). Bound 3.5% (2.5% before, 2% before
/// that), and the shadow must matter where it did: without it the
/// second plan is more than 4% fast. The DP exposure within 1% of the step. A replay that
/// lost a dependency (the optimizer not waiting, a bucket issued at the wrong kernel) moves
/// the step by more.
#[test]
fn replayed_dp_collectives_match_the_simulated_ones() {
    let m = model("llama3-8b");
    let cases = [
        ("dgx-h100", 8, "tp = 8\npp = 2\ndp = 4\nzero = 1\nmbs = 1\ngbs = 16\nseq = 2048\n"),
        ("dgx-h100", 16, "tp = 4\npp = 4\nvpp = 2\ndp = 8\nmbs = 1\ngbs = 32\nseq = 2048\n"),
        ("dgx-h100", 8, "tp = 2\npp = 2\ndp = 16\nzero = 3\nmbs = 1\ngbs = 32\nseq = 2048\n"),
        (
            "dgx-h100",
            8,
            "tp = 8\npp = 4\ndp = 2\nmbs = 1\ngbs = 16\nseq = 2048\noverlap_grad_reduce = false\n",
        ),
    ];
    // With NCCL_COLLNET_ENABLE=1, as measured above (NCCL's default, off, runs the second
    // plan's buckets on rings, where the shadows move it by 1.6%).
    let sharp = NcclPolicy { collnet: true, ..NcclPolicy::default() };
    for (topo, nodes, text) in cases {
        let f = built(topo, nodes);
        let plan = plan_text(&m, f.num_gpus() as u64, text);
        let run = |opts: &EventOpts| {
            step_event_with(&f, &m, &plan, opts, &FabricPricer::with_policy(&f, &sharp)).unwrap()
        };
        let replay = run(&EventOpts::default());
        let full = run(&EventOpts { replay: false, ..EventOpts::default() });
        assert!(replay.replayed > 0 && full.replayed == 0, "{text:?}");
        // The replay's distinct timings, counted even where the step's pricing of its layers
        // had already simulated them (the header had said "replayed from 0").
        assert!(replay.replay_memo > 0 && replay.replay_memo <= replay.memoized, "{text:?}");
        assert_eq!(full.replay_memo, 0, "{text:?}");
        // The same collectives, or fewer where the replay merged buckets (one job each, at
        // the summed time of its NCCL calls); the full simulation runs every bucket.
        let jobs = replay.explicit + replay.replayed;
        assert!(jobs <= full.explicit, "{text:?}: {jobs} jobs replayed vs {} simulated", full.explicit);
        // Fewer events where the group has more than two ranks (with two, the shadow is the
        // real collective, and the proxy's kernels add a few).
        let fewer =
            if plan.dp > 2 { replay.events < full.events } else { replay.events <= full.events + 100 };
        assert!(fewer, "{text:?}: {} vs {} events", replay.events, full.events);
        let err = rel_err(replay.estimate.step_time_s, full.estimate.step_time_s);
        eprintln!(
            "{text:?}: replay {:.5} s vs simulated {:.5} s ({:+.2}%), events {} vs {}",
            replay.estimate.step_time_s,
            full.estimate.step_time_s,
            100.0 * (replay.estimate.step_time_s / full.estimate.step_time_s - 1.0),
            replay.events,
            full.events
        );
        let (r, s) = (replay.estimate.step_time_s, full.estimate.step_time_s);
        assert!(err < 0.035, "{text:?}: replay {r} s vs simulated {s} s");
        // Compute is the same; DP exposure agrees within 1% of the step.
        let (a, b) = (replay.estimate.breakdown, full.estimate.breakdown);
        assert!(rel_err(a.compute, b.compute) < 1e-9, "{text:?}");
        assert!((a.dp - b.dp).abs() < 0.01 * full.estimate.step_time_s, "{text:?}: {a:?} vs {b:?}");
        if text.contains("vpp = 2") {
            let bare = run(&EventOpts { nic_shadows: false, ..EventOpts::default() });
            let (b, s) = (bare.estimate.step_time_s, full.estimate.step_time_s);
            // Without them the buckets reduced during the backward no longer share the NIC
            // with the pipeline transfers: too fast, and farther off than with them.
            assert!(b < 0.98 * s, "{text:?}: without NIC shadows {b} s vs simulated {s} s");
            assert!(
                rel_err(b, s) > rel_err(r, s),
                "{text:?}: without NIC shadows {b} s, with {r} s, simulated {s} s"
            );
        }
    }
}

/// A replayed collective's NIC shadow loads only what the real one loads, for as long as it
/// runs. Two ways it had loaded more, each making the replayed step about 24% slower than
/// its full simulation:
/// - Rails: stage 1's representative on three HGX H200 (FSDP group of 12 ranks from local
///   rank 4) paired with the first peer in another node, at local rank 0; that traffic
///   reached it over the rail-0 GPU of its own node (PXN) and queued behind stage 0's
///   shadow on that NIC (ZeRO-3 gathers 40% long; replay +16.1%). The pair now keeps to
///   the representative's rail, as NCCL's rings cross nodes.
/// - Caps: a Mixtral expert gather asked its shadow for 98.6% of the pair's rate, where the
///   fitted cap per connection ran 39% long (20.6 ms for a 14.8 ms gather, every layer).
///   A cap is kept only when its run takes the collective's time within 5%.
///
/// And one way it had loaded less: a two-rank ring, where the real ring is longer, sends
/// each chunk only once its peer's has come and holds fewer at the NIC than a ring whose
/// ranks forward their predecessors' chunks; beside the K/V all-gathers of a CP group
/// across nodes it yielded the NIC to them (GPT 1.7B, TP 8 CP 4 PP 2 FSDP on 8 A3 Ultra:
/// replay -6.8%). The shadow of a ring over three or more domains is a ring of three.
#[test]
fn nic_shadows_load_what_the_replayed_collective_loads() {
    let cases = [
        ("llama3-8b", "hgx-h200", 3, "tp = 1\npp = 2\ncp = 4\nzero = 3\nmbs = 1\ngbs = 6\nseq = 2048\n"),
        (
            "megatron-gpt-1.7b",
            "gcp-a3-ultra",
            8,
            "tp = 8\ncp = 4\npp = 2\nfsdp = \"full\"\ncp_comm = \"all_gather\"\nmbs = 1\ngbs = 8\nseq = 16384\n",
        ),
        (
            "mixtral-8x7b",
            "oci-bm-gpu4-8",
            3,
            "tp = 4\ncp = 2\nfsdp = \"full\"\nmbs = 1\ngbs = 3\nseq = 2048\nrecompute = \"selective\"\n",
        ),
    ];
    for (name, topo, nodes, text) in cases {
        let (m, f) = (model(name), built(topo, nodes));
        let plan = plan_text(&m, f.num_gpus() as u64, text);
        let run = |o: &EventOpts| step_event(&f, &m, &plan, o).unwrap().estimate.step_time_s;
        let (replay, full) =
            (run(&EventOpts::default()), run(&EventOpts { replay: false, ..EventOpts::default() }));
        // Measured -1.0%, -0.8% and +0.3% (were +16.1%, -6.8% and +24.2%, the last +2.8% while
        // the shadows were two-rank rings).
        assert!(rel_err(replay, full) < 0.035, "{name} on {topo}: replay {replay} s vs simulated {full} s");
    }
}

/// A stage's expert communicators (the experts' DP buckets, their ZeRO-3 gathers) are
/// replayed on an idle peer of their own, beside the dense communicator's on the proxy, as
/// their NCCL streams run side by side; what the two share is the representative's NIC,
/// which their shadows carry. Against every collective simulated on all its ranks, Mixtral
/// 8x7B EP 4 DP 16 on two DGX H100: ZeRO-0 +0.5%, ZeRO-1 +0.6%, ZeRO-3 -0.2%, ZeRO-3
/// without prefetch +0.1%. On one shared proxy the two communicators' replayed times added
/// up: +2.3%, +1.0%, +3.0%, +2.1% (and +9% to +12% against the closed form with one NCCL
/// call per parameter tensor, whose fixed costs added up too). The closed form within 2% of
/// the full simulation too (measured -0.6% to +1.0%; with EP 8 the expert gathers, over two
/// ranks in two nodes, outlast every layer, and the closed form was 7.4% high while it
/// added the SM share those gathers cost the layers on top of the gathers: -0.5% now).
#[test]
fn expert_communicators_replay_beside_the_dense_one() {
    let m = model("mixtral-8x7b");
    let f = built("dgx-h100", 2);
    let base = "tp = 1\nmbs = 1\ngbs = 32\nseq = 2048\ndp = 16\n";
    for extra in [
        "ep = 4\nzero = 0\n",
        "ep = 4\nzero = 1\n",
        "ep = 4\nzero = 3\n",
        "ep = 4\nzero = 3\noverlap_param_gather = false\n",
        "ep = 8\nzero = 3\n",
    ] {
        let plan = plan_text(&m, 16, &format!("{base}{extra}"));
        let replay = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
        let full = step_event(&f, &m, &plan, &EventOpts { replay: false, ..EventOpts::default() }).unwrap();
        let (r, s) = (replay.estimate.step_time_s, full.estimate.step_time_s);
        assert!(replay.replayed > 0 && full.replayed == 0, "{extra:?}");
        assert!(rel_err(r, s) < 0.01, "{extra:?}: replay {r} s vs simulated {s} s");
        let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
        assert!(
            rel_err(a.step_time_s, s) < 0.02,
            "{extra:?}: closed form {} s vs simulated {s} s",
            a.step_time_s
        );
    }
}

/// Megatron-Core reduces a communicator's gradient buckets one after another (one NCCL stream
/// per process group). Without `overlap_grad_reduce` a buffer is one bucket and each buffer's
/// reduction is issued synchronously, the experts' after the dense one, so that nothing of it
/// overlaps. The event mode had run the buckets of one group at once and the two buffers side
/// by side (the Mixtral plan below 0.478 s against 0.621 s in the closed form, which priced
/// 80 MB buckets; the Llama plan 8% apart); now the modes agree.
#[test]
fn gradient_buckets_of_one_communicator_run_in_turn() {
    use fabricsim::workload::comm::grad_reduces;
    let moe = model("mixtral-8x7b");
    let f = built("dgx-b200", 2);
    let text = "tp = 1\ncp = 2\ndp = 8\nep = 4\nsp = false\nmbs = 1\ngbs = 8\nseq = 4096\n";
    let off = plan_text(&moe, 16, &format!("{text}overlap_grad_reduce = false\n"));
    let on = plan_text(&moe, 16, text);
    // Dense over dp x cp, experts over expert-DP: one bucket each without the overlap.
    let (g_off, g_on) = (grad_reduces(&moe, &off, 0), grad_reduces(&moe, &on, 0));
    assert_eq!(g_off.len(), 2);
    assert!(g_off.iter().all(|g| g.buckets == 1), "{g_off:?}");
    assert!(g_on.iter().all(|g| g.buckets == g.bytes.div_ceil(on.bucket_bytes)), "{g_on:?}");
    let (a, _) = step_on_fabric(&f, &moe, &off).unwrap();
    let e = step_event(&f, &moe, &off, &EventOpts::default()).unwrap();
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.02, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
    let dp: Vec<&StepJob> = e.jobs.iter().filter(|j| j.kind == StepJobKind::Dp).collect();
    assert_eq!(dp.len(), 2, "{dp:?}");
    assert!(dp[0].ranks == 16 && dp[1].ranks == 4 && dp[1].start >= dp[0].end, "{dp:?}");

    // With the overlap: 16 buckets on one DP group of 4 ranks, each after the last.
    let dense = model("llama2-7b");
    let f = built("dgx-h100", 2);
    let plan = plan_text(&dense, 16, "tp = 4\ncp = 2\ndp = 2\nmbs = 1\ngbs = 2\nseq = 4096\n");
    let (a, _) = step_on_fabric(&f, &dense, &plan).unwrap();
    let e = step_event(&f, &dense, &plan, &EventOpts::default()).unwrap();
    let dp: Vec<&StepJob> = e.jobs.iter().filter(|j| j.kind == StepJobKind::Dp).collect();
    assert!(dp.len() > 8, "{dp:?}");
    for w in dp.windows(2) {
        assert!(w[1].start >= w[0].end, "{} starts before {} ends", w[1].name, w[0].name);
    }
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.03, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
}

/// Across the trays of one NVL72 rack an EP group's all-to-all runs over NVLink and reaches
/// no NIC: it gets no NIC shadow (it had one, between two trays over NVLink, which ran
/// faster than the all-to-all it stood for: Mixtral 8x7B below 6.9% under the closed form,
/// DeepSeek-V3 TP 4 EP 8 on 8 trays 21%).
#[test]
fn nothing_is_shadowed_inside_an_nvlink_domain() {
    let m = model("mixtral-8x7b");
    let f = built("gb200-nvl72", 4);
    let plan = plan_text(&m, 16, "tp = 2\nep = 8\ndp = 8\nmbs = 1\ngbs = 16\nseq = 4096\n");
    let ranks = Placement::new(&plan).group_of(GroupKind::Ep, 0);
    let nodes: std::collections::BTreeSet<u32> = ranks.iter().map(|&r| f.node_of_rank(r as u32)).collect();
    assert!(nodes.len() > 1, "the EP group spans trays: {ranks:?}");
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    assert!(!e.jobs.iter().any(|j| j.kind == StepJobKind::Ep), "no EP shadow");
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let (ea, ee) = (a.breakdown.ep, e.estimate.breakdown.ep);
    assert!(ea > 0.0 && rel_err(ee, ea) < 0.01, "EP {ee} s event vs {ea} s closed form");
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.01, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
}

/// A hidden ZeRO-3/FSDP gather still shares the NIC with the layer's traffic that leaves the
/// NVLink domain: the NIC serves both while both are on it, so the EP all-to-alls on the
/// critical path slow by what the gathers take of the NIC beside them. DeepSeek-V3, TP 8 EP 8
/// FSDP in shards of 8 on 8 B200 nodes: the EP all-to-all and both weight gathers cross the
/// same NICs. The closed form hid the gathers under the layers as if the NIC were free, 16%
/// under the event mode (1.249 s against 1.450 s); with the NIC time of each collective
/// (`CommPricer::nic`) and the gather's share spread over the pass, 3% under (1.406 s); since
/// the gather takes the NIC by its connections from the pass's start, beside an EP shadow
/// that lasts the all-to-alls alone, 2% over (1.593 s against 1.561 s). A pricer that knows
/// no NIC prices the same plan faster: the NIC terms only ever add time.
#[test]
fn a_hidden_gather_shares_the_nic_with_the_layers_traffic() {
    let m = model("deepseek-v3");
    let f = built("superpod-b200", 8);
    let plan = plan_text(
        &m,
        64,
        "tp = 8\nep = 8\ndp = 8\nfsdp = \"full\"\nrecompute = \"none\"\ndtype = \"fp8\"\n\
         mbs = 1\ngbs = 8\nseq = 8192\n",
    );
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let ev = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let err = rel_err(a.step_time_s, ev.estimate.step_time_s);
    assert!(err < 0.06, "analytical {} s vs event {} s", a.step_time_s, ev.estimate.step_time_s);

    let pricer = FabricPricer::new(&f);
    let no_nic = |k: CollectiveKind, b: u64, r: &[u64]| pricer.step_price(k, b, r, &[]);
    let g = f.gpu.clone();
    let params = GpuParams::for_fabric(&f).unwrap();
    let blind = estimate(&m, &plan, &g, params, &no_nic).unwrap();
    assert!(
        blind.step_time_s < 0.95 * a.step_time_s,
        "without NIC times {} s, with {} s",
        blind.step_time_s,
        a.step_time_s
    );
}

/// A ring attention's KV exchanges across nodes meet a prefetched ZeRO-3/FSDP gather on the
/// NIC only in their bursts (the gather has the NIC alone between them, through the layer's
/// GEMMs and NVLink traffic), and a delay costs the step only what it exposes beyond the
/// attention they hide behind. The closed form had charged the exchanges' whole time at the
/// gather's pace, as if on the critical path: GPT 18.4B, TP 8 CP 2 FSDP on 8 A3 Ultra
/// nodes, 12.7% over the event mode at 4 micro-batches; GPT 1.7B, TP 8 CP 4 ZeRO-3 FP8 on
/// 4 DGX B200 (the exchanges outlast the attention), 25% over at 64. EP all-to-alls on the
/// critical path still meet the gather whole (`a_hidden_gather_shares_the_nic_with_the_layers_traffic`).
#[test]
fn a_gather_meets_the_ring_attentions_exchanges_in_their_bursts() {
    let cases = [
        // (model, topology, nodes, plan, bound): measured -1.1% and +7.2%.
        (
            "megatron-gpt-18.4b",
            "gcp-a3-ultra",
            8,
            "tp = 8\ncp = 2\nfsdp = \"full\"\nmbs = 1\ngbs = 4\nseq = 32768\n",
            0.03,
        ),
        (
            "megatron-gpt-1.7b",
            "dgx-b200",
            4,
            "tp = 8\ncp = 4\nzero = 3\ndtype = \"fp8\"\nmbs = 1\ngbs = 8\nseq = 16384\n",
            0.10,
        ),
    ];
    for (name, topo, nodes, text, bound) in cases {
        let (m, f) = (model(name), built(topo, nodes));
        let plan = plan_text(&m, f.num_gpus() as u64, text);
        let (ev, an) = event_and_closed_form(&f, &m, &plan);
        assert!(rel_err(an, ev) < bound, "{name}: analytical {an} s vs event {ev} s");
    }
}

/// Waiting for a weight gather is not overlap: no kernel runs then, so the SM share of the
/// collectives in flight does not slow the op by it, in an op with CP shadows (a ring
/// attention across nodes) too. ZeRO-3 without prefetch, Llama 3 8B TP 2 CP 8 on 4
/// SuperPOD H100 nodes: every gather is exposed and the event mode had slowed each op by the
/// share of its gathers' whole time, 6.8% over the closed form (1.590 s against 1.488 s).
#[test]
fn a_gather_waited_for_is_not_overlap() {
    let m = model("llama3-8b");
    let f = built("superpod-h100", 4);
    let text = "tp = 2\ncp = 8\nzero = 3\ndtype = \"fp8\"\noverlap_param_gather = false\nmbs = 1\ngbs = 16\nseq = 2048\n";
    let plan = plan_text(&m, f.num_gpus() as u64, text);
    let (ev, an) = event_and_closed_form(&f, &m, &plan);
    // Measured +0.0%.
    assert!(rel_err(ev, an) < 0.01, "event {ev} s vs analytical {an} s");
}

/// Under `cp_comm = "all_gather"` the attention needs the whole sequence's K and V: the
/// event mode's CP shadow of a layer (a CP group across nodes) runs before the layer's
/// kernel, which waits for it, as the closed form exposes the gather. It had run beside the
/// kernel, which then hid it under its compute: Llama 3 8B, TP 8 CP 4 ZeRO-3 on 4 DGX H100
/// at 16,384 tokens took 1.281 s in the event mode against the closed form's 1.462 (-12.4%;
/// GPT 1.7B, TP 8 CP 4 PP 2 FSDP on 8 A3 Ultra, -18.5%). Simulated on all ranks the step
/// is now 1.536 s (+5.1%); replayed, 1.472 s (+0.7%). The replay had been 1.355 s (-7.3%,
/// -11.8% against the full simulation) while the replayed weight gathers' NIC shadows were
/// two-rank rings, which yield the NIC to the K/V gathers more than the real ring of four
/// does (`lower::shadow_ring`: a ring of three now).
#[test]
fn a_cp_all_gather_precedes_its_attention() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 4);
    let text = "tp = 8\ncp = 4\nzero = 3\ncp_comm = \"all_gather\"\nmbs = 1\ngbs = 8\nseq = 16384\n";
    let plan = plan_text(&m, f.num_gpus() as u64, text);
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let an = a.step_time_s;
    let replayed = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let job =
        |name: &str| replayed.jobs.iter().find(|j| j.name == name).unwrap_or_else(|| panic!("no job {name}"));
    for pass in ["F", "B"] {
        let op = job(&format!("stage 0 {pass} mb 0 chunk 0"));
        let gather = job(&format!("stage 0 {pass} mb 0 chunk 0 layer 0 cp kv exchange"));
        assert!(
            gather.end <= op.start,
            "{pass}: the first layer's K/V gather ends at {:?}, after its kernel starts at {:?}",
            gather.end,
            op.start
        );
    }
    let ev = replayed.estimate.step_time_s;
    let full = step_event(&f, &m, &plan, &EventOpts { replay: false, ..EventOpts::default() }).unwrap();
    let full = full.estimate.step_time_s;
    // Measured +5.1% and +0.7%; the replay -4.2% against the full simulation (was -11.8%).
    assert!(rel_err(full, an) < 0.06, "full simulation {full} s vs analytical {an} s");
    assert!(rel_err(ev, an) < 0.03, "event {ev} s vs analytical {an} s");
    assert!(rel_err(ev, full) < 0.05, "replayed {ev} s vs full simulation {full} s");
}

/// The event mode's EP shadow of a layer stands for its all-to-alls through the NIC and lasts
/// their time; the expert-TP gathers and reduce-scatters inside the node stay in the layer's
/// kernel. It had been stretched over the layer's whole EP time, all-to-alls and expert-TP
/// collectives (DeepSeek-V3, TP 8 EP 8 on 8 B200 nodes: 6.7 ms for 4.7 ms of all-to-alls),
/// which spread its load on the NIC thin, and a weight gather beside it took less of the
/// all-to-alls' time than it does (the FSDP plan above: 1.450 s, now 1.561 s).
#[test]
fn an_ep_shadow_lasts_its_all_to_alls_through_the_nic() {
    use fabricsim::workload::comm::layer_comms;
    let m = model("deepseek-v3");
    let f = built("superpod-b200", 8);
    let plan = plan_text(
        &m,
        64,
        "tp = 8\nep = 8\ndp = 8\nrecompute = \"none\"\ndtype = \"fp8\"\nmbs = 1\ngbs = 8\nseq = 8192\n",
    );
    let pricer = FabricPricer::new(&f);
    let pl = Placement::new(&plan);
    let rank = pl.rank(Coord { tp: 0, cp: 0, ep: 0, dp: 0, pp: 0 });
    let layer = 10;
    assert!(m.is_moe_layer(layer));
    let time_of = |group: GroupKind| -> f64 {
        let ranks = pl.group_of(group, rank);
        layer_comms(&m, &plan, layer)
            .iter()
            .filter(|op| op.group == group && op.pass == Pass::F)
            .map(|op| op.count as f64 * pricer.event(op.kind, op.bytes, &ranks))
            .sum()
    };
    let (a2a, etp) = (time_of(GroupKind::Ep), time_of(GroupKind::Etp));
    assert!(a2a > 0.0 && etp > 0.2 * a2a, "all-to-alls {a2a} s, expert-TP {etp} s");
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let name = format!("stage 0 F mb 0 chunk 0 layer {layer} ep all-to-all");
    let j = e.jobs.iter().find(|j| j.name == name).unwrap_or_else(|| panic!("no job {name}"));
    let took = j.end.as_secs() - j.start.as_secs();
    // Within the shadow's own fit (its cap is set from two runs; 5% short here), and far
    // from the all-to-alls and expert-TP collectives together.
    assert!(rel_err(took, a2a) < 0.08, "EP shadow {took} s, all-to-alls {a2a} s, expert-TP {etp} s");
}

/// A NIC shadow runs on at least one channel per NIC of its GPU, as the traffic it stands
/// for spreads over them: on an AWS p5 (four 100G NICs per H100) the all-to-all's and the
/// weight gather's shadows each ran on two channels, so both loaded the same two NICs and
/// slowed each other where the real collectives share four. Mixtral 8x7B TP 8 EP 8 FSDP on
/// 8 p5: the event mode 7% over the closed form (19% once the EP shadow lasted the
/// all-to-alls alone), 2% now.
#[test]
fn nic_shadows_load_every_nic_of_the_gpu() {
    let m = model("mixtral-8x7b");
    let f = built("aws-p5", 8);
    assert_eq!(f.nics_per_gpu(0), 4);
    let plan = plan_text(
        &m,
        64,
        "tp = 8\nep = 8\ndp = 8\nfsdp = \"full\"\nrecompute = \"none\"\ndtype = \"fp8\"\n\
         overlap_grad_reduce = false\nmbs = 2\ngbs = 128\nseq = 2048\n",
    );
    let (ev, an) = event_and_closed_form(&f, &m, &plan);
    assert!(rel_err(ev, an) < 0.05, "event {ev} s vs analytical {an} s");
}

/// With fewer GPUs kept per node than the node has (`topology.gpus`, `--gpus`), a GPU drives
/// the NICs NCCL gives it (its own and closest), not the whole node's: an AWS p5 GPU alone
/// on its node has its four 100G NICs (50 GB/s), not the node's 32 (400 GB/s, as before).
/// The closed form priced Mixtral 8x7B's EP 8 all-to-alls across eight such nodes at the
/// node's rate while the event mode's routes used the four NICs: the closed form was 14%
/// under the event mode (9.24 s against 10.79), 3% now.
#[test]
fn a_gpu_kept_alone_drives_its_own_nics_not_the_nodes() {
    let spec = load_topology(&root().join("topologies/aws-p5.toml")).unwrap();
    let f = build(&spec, &BuildOpts { nodes: Some(8), gpus_per_node: Some(1), params: None }).unwrap();
    assert_eq!(f.nics_per_gpu(0), 4);
    assert_eq!(f.gpu_network_bw(0).gbytes(), 50.0);
    let m = model("mixtral-8x7b");
    let plan =
        plan_text(&m, 8, "ep = 8\ndp = 8\nzero = 3\nrecompute = \"full\"\nmbs = 1\ngbs = 64\nseq = 4096\n");
    let (ev, an) = event_and_closed_form(&f, &m, &plan);
    assert!(rel_err(ev, an) < 0.05, "event {ev} s vs analytical {an} s");
}

/// An all-to-all loads each NIC its group leaves a node through with one rank's traffic to
/// other nodes, (n - local)/n of its buffer: every rank sends its own, over its rail or
/// relayed by the rail's owner (PXN). A ring crosses the node once per channel, so an
/// all-gather's (n-1)/n is shared among the node's ranks. The NIC shadows (and so the
/// closed form's NIC time) had priced the all-to-all as the ring: 4.3x too little for EP 16
/// on two DGX H100 nodes, 7x for DeepSeek-V3's EP 64 (4 ranks a node under TP 2), whose
/// event step on 1,024 H100 then went 13.6% -> 11.3% over the published throughput.
#[test]
fn an_all_to_all_loads_each_nic_with_a_ranks_remote_share() {
    let f = built("dgx-h100", 2);
    let pricer = FabricPricer::new(&f);
    let rate = f.gpu_network_bw(0).bytes_per_sec() as f64 * f.params.link.net.efficiency;
    let ranks: Vec<u64> = (0..16).collect();
    let b = 256u64 << 20;
    let a2a = pricer.nic(CollectiveKind::AllToAll, b, &ranks);
    let want = b as f64 * 8.0 / 16.0 / rate;
    assert!(rel_err(a2a, want) < 1e-6, "all-to-all NIC time {a2a} s, want {want} s");
    let ag = pricer.nic(CollectiveKind::AllGather, b, &ranks);
    let want = b as f64 * 15.0 / 16.0 / 8.0 / rate;
    assert!(rel_err(ag, want) < 1e-6, "all-gather NIC time {ag} s, want {want} s");
    // Inside one node nothing reaches a NIC.
    assert_eq!(pricer.nic(CollectiveKind::AllToAll, b, &ranks[..8]), 0.0);
}

/// A communicator's ZeRO-3/FSDP gathers and reduce-scatters run one after another, in the
/// order they are issued (one NCCL stream per process group): the event mode had let a
/// layer's prefetched gather start while the previous layer's was still running, the two
/// sharing the NIC and overlapping their fixed costs (GPT 7.5B, PP 4 CP 2 FSDP hybrid on 8
/// DGX B200: event 8.1% under the closed form, which sums them; 6.6% after).
#[test]
fn a_communicators_weight_gathers_run_in_turn() {
    let m = model("megatron-gpt-7.5b");
    let f = built("dgx-h100", 2);
    let plan = plan_text(&m, 16, "tp = 1\npp = 2\ndp = 8\nfsdp = \"full\"\nmbs = 1\ngbs = 16\nseq = 4096\n");
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let mut jobs: Vec<&StepJob> = e.jobs.iter().filter(|j| j.kind == StepJobKind::Fsdp).collect();
    assert!(jobs.len() > 4 * m.layers as usize, "{} FSDP jobs", jobs.len());
    jobs.sort_by_key(|j| (j.stage, j.start));
    for w in jobs.windows(2).filter(|w| w[0].stage == w[1].stage) {
        assert!(w[1].start >= w[0].end, "{} starts before {} ends", w[1].name, w[0].name);
    }
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.06, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
}

/// Replayed DP buckets beyond `max_buckets` are merged into fewer jobs, but each job costs
/// what its NCCL calls cost one after another: every call pays the ring's fixed cost (on 64
/// ranks, one per node, 63 network steps). The merged job had been priced as one collective
/// of the summed size, which dropped those costs: with 10 MB buckets (201 per step) on 64
/// DGX H100 the event step came out about 25% under the closed form, which prices every
/// bucket; and Nemotron-4 15B at DP 288 was 10.5% under it. Also: the buckets reduced during
/// the backward slow it by the SM share in both modes (the closed form had not charged it).
#[test]
fn merged_buckets_pay_every_calls_fixed_cost() {
    use fabricsim::workload::comm::grad_reduces;
    use fabricsim::workload::plan::GroupKind;
    let m = model("llama3-8b");
    let f = built("dgx-h100", 64);
    let plan =
        plan_text(&m, 512, "tp = 8\ndp = 64\nzero = 1\nmbs = 1\ngbs = 128\nseq = 4096\nbucket = \"10MB\"\n");
    // NCCL before PAT (2.23): rings.
    let pairs = [("NCCL_ALGO".to_string(), "^PAT".to_string())];
    let (ring, _) = fabricsim::scenario::nccl_env::training_policy(&pairs).unwrap();
    let pricer = FabricPricer::with_policy(&f, &ring);
    let g = &grad_reduces(&m, &plan, 0)[0];
    assert!(g.buckets > 200, "{g:?}");
    let unit = g.bytes.div_ceil(g.buckets);
    let ranks = fabricsim::workload::plan::Placement::new(&plan).group_of(GroupKind::DpCp, 0);
    let one = pricer.event(g.kind, unit, &ranks);
    let e = step_event_with(&f, &m, &plan, &EventOpts::default(), &pricer).unwrap();
    let dp: Vec<&StepJob> = e.jobs.iter().filter(|j| j.kind == StepJobKind::Dp).collect();
    assert_eq!(dp.len() as u64, EventOpts::default().max_buckets, "{dp:?}");
    let total: f64 = dp.iter().map(|j| j.end.as_secs() - j.start.as_secs()).sum();
    let calls = g.buckets as f64 * one;
    assert!(rel_err(total, calls) < 0.01, "merged jobs {total:.5} s vs {} calls {calls:.5} s", g.buckets);
    let (a, _) = step_on_fabric_with(&f, &m, &plan, &ring).unwrap();
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.04, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
    // Both modes charge the SM share of the overlapped buckets to DP, and the parts add up.
    for (mode, est) in [("event", &e.estimate), ("analytical", &a)] {
        let b = est.breakdown;
        assert!(rel_err(b.total(), est.step_time_s) < 0.01, "{mode}: {b:?} vs {}", est.step_time_s);
        assert!(b.dp > 0.05, "{mode}: {b:?}");
    }
}

/// A NIC shadow's peer copies the representative: it waits for the pipeline transfer that
/// feeds the op as the representative does (it had started early, so an op with EP shadows
/// seemed to run from long before its input arrived and the EP time of the breakdown grew:
/// the parts added up to 10% more than the step), and the layer's CP and TP shadows follow
/// its EP shadow (the attention's exchanges and the MoE all-to-alls take turns on the NIC;
/// side by side they slowed each other: DeepSeek-V3 with CP 2 and EP 2 across two B200
/// nodes ran 20% over the closed form). Mixtral 8x7B, TP 8 PP 2 VPP 2 CP 2 EP 2 on four
/// DGX B200: the CP and EP peers are the same rank on the other node.
#[test]
fn layer_shadows_wait_for_what_their_op_waits_for() {
    let m = model("mixtral-8x7b");
    let f = built("dgx-b200", 4);
    let text = "tp = 8\npp = 2\nvpp = 2\ncp = 2\nep = 2\nmbs = 1\ngbs = 4\nseq = 4096\n";
    let plan = plan_text(&m, 32, text);
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let (step, b) = (e.estimate.step_time_s, e.estimate.breakdown);
    assert!(rel_err(b.total(), step) < 0.01, "parts {:.4} s vs step {step:.4} s: {b:?}", b.total());
    assert!(rel_err(b.ep, a.breakdown.ep) < 0.05, "EP {:.4} s vs {:.4} s", b.ep, a.breakdown.ep);
    assert!(rel_err(step, a.step_time_s) < 0.02, "event {step:.4} s vs analytical {:.4} s", a.step_time_s);
    assert!(
        e.jobs.iter().any(|j| j.kind == StepJobKind::Ep) && e.jobs.iter().any(|j| j.kind == StepJobKind::Cp)
    );
}

/// A NIC shadow alone takes the time of the collective it stands for. A DP all-reduce that
/// keeps the NIC busy needs a cap at the shadow's uncapped rate per connection, and a capped
/// connection waits out its steps' latencies at that rate: capped, the shadow ran 18% long
/// (Llama 3 8B, TP 8 DP 4 on four DGX H100 without the overlap: 0.1689 s against 0.1567 s
/// without shadows); such a shadow now runs uncapped.
#[test]
fn a_shadow_that_fills_the_nic_is_not_capped() {
    let m = model("llama3-8b");
    let f = built("dgx-h100", 4);
    let plan =
        plan_text(&m, 32, "tp = 8\ndp = 4\nmbs = 1\ngbs = 4\nseq = 4096\noverlap_grad_reduce = false\n");
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let with = step_event(&f, &m, &plan, &EventOpts::default()).unwrap().estimate;
    let bare = step_event(&f, &m, &plan, &EventOpts { nic_shadows: false, ..EventOpts::default() })
        .unwrap()
        .estimate;
    assert!(with.breakdown.dp > 0.3 * with.step_time_s, "{:?}", with.breakdown);
    let err = rel_err(with.step_time_s, bare.step_time_s);
    assert!(err < 0.005, "with shadows {:.4} s, without {:.4} s", with.step_time_s, bare.step_time_s);
    assert!(rel_err(with.step_time_s, a.step_time_s) < 0.01, "{} vs {}", with.step_time_s, a.step_time_s);
}

/// Under a schedule that splits the backward (ZB-H1) the weight gradients exist only after
/// the weight-gradient pass: ZeRO-3/FSDP reduce-scatters each layer's after its W kernel (they
/// had followed the input-gradient kernel), and the closed form hides them under the W pass
/// and the gathers under the input-gradient pass (it had hidden both under the whole
/// backward: 0.650 s against 0.724 s in the event mode for the plan below; now 1% apart).
#[test]
fn fsdp_reduces_the_weight_gradients_after_the_weight_pass() {
    let m = model("llama2-7b");
    let f = built("dgx-h100", 4);
    let text = "tp = 8\npp = 2\ndp = 2\nmbs = 2\ngbs = 64\nseq = 2048\nfsdp = \"full\"\nschedule = \"zb-h1\"\nrecompute = \"selective\"\n";
    let plan = plan_text(&m, 32, text);
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let op_start = |stage: u32, pass: &str, mb: &str| {
        let name = format!("stage {stage} {pass} mb {mb} chunk 0");
        e.jobs.iter().find(|j| j.name == name).unwrap_or_else(|| panic!("no {name}")).start
    };
    let mut n = 0;
    for j in e.jobs.iter().filter(|j| j.name.starts_with("fsdp reduce-scatter")) {
        // "fsdp reduce-scatter mb {mb} chunk 0 layer {k} stage {s}"
        let w: Vec<&str> = j.name.split(' ').collect();
        let (mb, stage): (&str, u32) = (w[3], w[9].parse().unwrap());
        assert!(j.start >= op_start(stage, "W", mb), "{} before its W pass", j.name);
        n += 1;
    }
    assert!(n > 0);
    let err = rel_err(e.estimate.step_time_s, a.step_time_s);
    assert!(err < 0.03, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
}

// ---------------------------------------------------------------- CP all-gather, EP imbalance

/// `cp_comm = "all_gather"`: K and V of the whole sequence all-gathered before the attention
/// (and again in backward, with a reduce-scatter of their gradients), on the critical path,
/// in both fidelities; the gathered layer held in communication buffers; unknown values
/// named with the valid ones.
#[test]
fn cp_all_gather_variant_is_priced_exposed_and_held_in_memory() {
    use fabricsim::workload::comm::{cp_kv_bytes, layer_comms, CollectiveKind};
    use fabricsim::workload::memory::memory_by_stage;
    use fabricsim::workload::plan::CpComm;
    let m = model("llama3-8b");
    let f = built("dgx-h100", 2);
    let text = "tp = 2\ncp = 4\ndp = 2\nmbs = 1\ngbs = 8\nseq = 8192\n";
    let p2p = plan_text(&m, 16, text);
    assert_eq!(p2p.cp_comm, CpComm::P2p, "p2p is the default");
    let ag = plan_text(&m, 16, &format!("{text}cp_comm = \"all_gather\"\n"));
    assert_eq!(ag.cp_comm, CpComm::AllGather);
    assert_eq!(plan_text(&m, 16, &format!("{text}cp_comm = \"allgather\"\n")), ag);
    // The collectives of a layer: one all-gather of cp x the local K/V forward, an all-gather
    // and a reduce-scatter backward; no ring steps.
    let kv = cp_kv_bytes(&m, &ag);
    let ops = layer_comms(&m, &ag, 0);
    let cp: Vec<_> = ops.iter().filter(|o| o.group == GroupKind::Cp).collect();
    assert_eq!(cp.len(), 3, "{cp:?}");
    assert!(cp.iter().all(|o| o.bytes == 4 * kv && o.count == 1));
    assert_eq!(cp.iter().filter(|o| o.kind == CollectiveKind::AllGather).count(), 2);
    assert_eq!(cp.iter().filter(|o| o.kind == CollectiveKind::ReduceScatter).count(), 1);
    // Memory: the gathered K/V and their gradients of one layer, nothing else changes.
    let (mp, ma) = (memory_by_stage(&m, &p2p).unwrap(), memory_by_stage(&m, &ag).unwrap());
    assert_eq!(ma[0].comm - mp[0].comm, 2 * 4 * kv);
    assert_eq!((ma[0].activations, ma[0].params), (mp[0].activations, mp[0].params));
    // Both fidelities: the gathers are exposed (CP time > 0 and more than ring attention's,
    // which hides behind the attention at this length), and the two modes agree.
    let (a_p2p, _) = step_on_fabric(&f, &m, &p2p).unwrap();
    let (a_ag, _) = step_on_fabric(&f, &m, &ag).unwrap();
    assert!(a_ag.breakdown.cp > a_p2p.breakdown.cp, "{:?} vs {:?}", a_ag.breakdown, a_p2p.breakdown);
    assert!(a_ag.step_time_s > a_p2p.step_time_s);
    // The same attention work in other kernels (one per chunk against the keys up to its
    // end, not one per ring step): the compute differs by their tiles alone.
    assert!(rel_err(a_ag.breakdown.compute, a_p2p.breakdown.compute) < 0.01);
    let e_ag = step_event(&f, &m, &ag, &EventOpts::default()).unwrap();
    assert!(rel_err(e_ag.estimate.breakdown.cp, a_ag.breakdown.cp) < 1e-9, "same CP pricing");
    assert!(rel_err(e_ag.estimate.step_time_s, a_ag.step_time_s) < 0.06);
    // Unknown values: the line and the valid choices.
    let e = parse_plan(&format!("{text}cp_comm = \"a2a\"\n"), Path::new("p.toml"), &m, 16).unwrap_err();
    let s = e.to_string();
    assert!(s.contains("p.toml:7") && s.contains("cp_comm") && s.contains("p2p, all_gather"), "{s}");
}

/// EP token-routing imbalance: 1.0 is today's balanced step, to the bit; a larger max/mean
/// ratio makes the busiest rank's all-to-all and expert GEMMs longer, so the step is
/// monotonically slower in both fidelities; the per-layer draw is fixed by the seed and
/// averages to the knob; bad values are named.
#[test]
fn ep_imbalance_slows_the_step_monotonically_and_is_seeded() {
    use fabricsim::workload::comm::ep_load_factors;
    let m = model("mixtral-8x7b");
    let f = built("dgx-h100", 2);
    let text = "tp = 2\nep = 8\ndp = 8\nmbs = 1\ngbs = 16\nseq = 2048\nzero = 1\n";
    let base = plan_text(&m, 16, text);
    let with = |imb: f64, seed: u64| Plan { ep_imbalance: imb, ep_seed: seed, ..base.clone() };
    let (a0, _) = step_on_fabric(&f, &m, &base).unwrap();
    let (a1, _) = step_on_fabric(&f, &m, &with(1.0, 7)).unwrap();
    assert_eq!(a0, a1, "imbalance 1.0 is the balanced step whatever the seed");
    let e0 = step_event(&f, &m, &base, &EventOpts::default()).unwrap();
    let e1 = step_event(&f, &m, &with(1.0, 7), &EventOpts::default()).unwrap();
    assert_eq!(e0.estimate, e1.estimate);
    let mut last = (a0.step_time_s, e0.estimate.step_time_s, a0.breakdown.ep);
    for imb in [1.25, 1.5, 2.0, 3.0] {
        let p = with(imb, 0);
        let (a, _) = step_on_fabric(&f, &m, &p).unwrap();
        let e = step_event(&f, &m, &p, &EventOpts::default()).unwrap();
        assert!(a.step_time_s > last.0, "analytical at {imb}: {} vs {}", a.step_time_s, last.0);
        assert!(e.estimate.step_time_s > last.1, "event at {imb}: {} vs {}", e.estimate.step_time_s, last.1);
        assert!(a.breakdown.ep > last.2, "the all-to-all at {imb}");
        assert!(a.breakdown.compute > a0.breakdown.compute, "the hot rank's expert GEMMs at {imb}");
        assert!(rel_err(e.estimate.step_time_s, a.step_time_s) < 0.06, "modes agree at {imb}");
        last = (a.step_time_s, e.estimate.step_time_s, a.breakdown.ep);
    }
    // The draw: deterministic per seed, mean over MoE layers equal to the knob, different
    // seeds spread the layers differently.
    let (f1, f2, f3) = (
        ep_load_factors(&m, &with(2.0, 1)),
        ep_load_factors(&m, &with(2.0, 1)),
        ep_load_factors(&m, &with(2.0, 2)),
    );
    assert_eq!(f1, f2);
    assert_ne!(f1, f3);
    for fs in [&f1, &f3] {
        let mean = fs.iter().sum::<f64>() / fs.len() as f64;
        assert!((mean - 2.0).abs() < 1e-12, "{mean}");
        assert!(fs.iter().all(|&x| x > 1.0 && x < 3.0 / 1.0), "{fs:?}");
    }
    // Bad values.
    for bad in ["0.5", "-1.0", "nan"] {
        let e =
            parse_plan(&format!("{text}ep_imbalance = {bad}\n"), Path::new("p.toml"), &m, 16).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("p.toml:8") && s.contains("ep_imbalance") && s.contains("1.0"), "{bad}: {s}");
    }
}

/// `fabricsim train` on Llama 3 8B and DGX H100 with these flags: (exit code, stdout, stderr).
fn train_llama3_8b(flags: &[&str], extra: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
        .args(["train", "--model", "models/llama3-8b.toml", "--topology", "topologies/dgx-h100.toml"])
        .args(flags)
        .args(extra)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `train` names groups that straddle NVLink domains they could fit in, in the table and in
/// the JSON (`notes`): CP groups of 16 on GB200 racks of 72 GPUs put ranks 64-79 across the
/// first rack boundary; groups of 8 never straddle.
#[test]
fn train_notes_groups_that_straddle_nvlink_domains() {
    let run = |cp: &str, dp: &str, json: bool| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fabricsim"))
            .args([
                "train",
                "--model",
                "models/llama3-8b.toml",
                "--topology",
                "topologies/gb200-nvl72-multirack.toml",
            ])
            .args([
                "--nodes",
                "20",
                "--tp",
                "1",
                "--cp",
                cp,
                "--dp",
                dp,
                "--gbs",
                dp,
                "--seq",
                "8192",
                "--allow-oom",
            ])
            .args(if json { &["--format", "json"][..] } else { &[][..] })
            .current_dir(root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = run("16", "5", false);
    assert!(
        table.contains("# note: 1 of 5 CP groups (16 GPUs each) straddle NVLink domains (ranks 64-79"),
        "{table}"
    );
    let doc: serde_json::Value = serde_json::from_str(&run("16", "5", true)).unwrap();
    assert_eq!(doc["notes"].as_array().unwrap().len(), 1, "{doc}");
    let doc: serde_json::Value = serde_json::from_str(&run("8", "10", true)).unwrap();
    assert!(doc["notes"].as_array().unwrap().is_empty(), "{doc}");
}

/// The new plan flags from the command line: `--cp-comm all_gather` runs in the event mode
/// with exposed CP time, `--no-replay` only with `--fidelity event`, and bad values exit 2
/// naming the flag or key and the valid choices.
#[test]
fn train_flags_for_cp_comm_ep_imbalance_and_replay() {
    let run = |extra: &[&str]| {
        train_llama3_8b(
            &["--nodes", "2", "--tp", "2", "--cp", "4", "--gbs", "8", "--seq", "8192", "--allow-oom"],
            extra,
        )
    };
    let (code, out, err) = run(&["--cp-comm", "all_gather", "--fidelity", "event", "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["breakdown"]["cp_s"].as_f64().unwrap() > 0.0, "{out}");
    // The alias, and the plan line naming the variant (shown only when not the default).
    let (code, out, err) = run(&["--cp-comm", "allgather"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().next().unwrap().ends_with(", cp_comm all_gather"), "{out}");
    let (_, out, _) = run(&[]);
    assert!(!out.contains("cp_comm"), "{out}");
    let (code, _, err) = run(&["--cp-comm", "ring"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--cp-comm") && err.contains("all_gather") && err.contains("p2p"), "{err}");
    let (code, _, err) = run(&["--ep-imbalance", "0.5"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("ep_imbalance") && err.contains("1.0"), "{err}");
    let (code, _, err) = run(&["--no-replay"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--no-replay") && err.contains("--fidelity event"), "{err}");
}

/// Every plan key has a flag: the flags give the same step as a plan file with the same
/// keys (JSON output byte for byte), a flag replaces the file's line, and a bad value names
/// the flag's key and the valid choices with exit status 2.
#[test]
fn every_plan_key_has_a_train_flag() {
    let run = |extra: &[&str]| {
        train_llama3_8b(
            &["--nodes", "2", "--gbs", "16", "--seq", "4096", "--allow-oom", "--format", "json"],
            extra,
        )
    };
    let keys = "tp = 2\npp = 2\nsp = false\nbucket = \"100MB\"\norder = \"tp-dp-cp-ep-pp\"\n\
                overlap_grad_reduce = false\noverlap_param_gather = false\ntp_comm_overlap = true\n\
                pp_comm_overlap = true\npp_scatter_gather = false\nzero = 1\n\
                pipeline_model_parallel_layout = \"Et*15|t*17L\"\nrecompute = \"selective\"\n\
                recompute_modules = \"mlp,layernorm\"\n";
    let dir = crate::temp_dir("plan-key-flags");
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, keys).unwrap();
    let (code, from_file, err) = run(&["--plan", plan.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let flags = [
        "--tp",
        "2",
        "--pp",
        "2",
        "--sp",
        "false",
        "--bucket",
        "100MB",
        "--order",
        "tp-dp-cp-ep-pp",
        "--overlap-grad-reduce",
        "false",
        "--overlap-param-gather",
        "false",
        "--tp-comm-overlap",
        "true",
        "--pp-comm-overlap",
        "true",
        "--pp-scatter-gather",
        "false",
        "--zero",
        "1",
        "--pipeline-model-parallel-layout",
        "Et*15|t*17L",
        "--recompute",
        "selective",
        "--recompute-modules",
        "mlp,layernorm",
    ];
    let (code, from_flags, err) = run(&flags);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(from_file, from_flags);
    // The switches matter: the defaults give another step.
    let (_, defaults, _) = run(&["--tp", "2", "--pp", "2", "--zero", "1"]);
    assert_ne!(defaults, from_flags);
    // A flag replaces the plan file's line.
    let (_, replaced, _) = run(&["--plan", plan.to_str().unwrap(), "--pp-scatter-gather", "true"]);
    assert_ne!(replaced, from_file);
    // FSDP through flags, and a bad value.
    let (code, _, err) = run(&["--tp", "2", "--fsdp", "hybrid", "--fsdp-shard", "8"]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run(&["--tp", "2", "--fsdp", "partial"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("fsdp") && err.contains("hybrid"), "{err}");
    // Expert keys on a dense model name the key (they were accepted and ignored).
    let (code, _, err) = run(&["--tp", "2", "--etp", "2"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("`etp`") && err.contains("llama3-8b has none"), "{err}");
    // ZeRO-3's gather unit through its flag, as through the plan file.
    std::fs::write(&plan, "tp = 2\nzero = 3\ngather_unit = \"tensor_list\"\n").unwrap();
    let (code, unit_file, err) = run(&["--plan", plan.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let (_, unit_flags, _) = run(&["--tp", "2", "--zero", "3", "--gather-unit", "tensor_list"]);
    assert_eq!(unit_file, unit_flags);
    let (_, per_layer, _) = run(&["--tp", "2", "--zero", "3"]);
    assert_ne!(per_layer, unit_flags);
    let (code, _, err) = run(&["--tp", "2", "--zero", "3", "--gather-unit", "bucket"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("tensor_list"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Megatron's scatter/gather of pipeline transfers (Narayanan et al. SC'21, Sec. 4.1;
/// `scatter_gather_tensors_in_pipeline`, on by default): without SP each of a stage's `t`
/// TP ranks sends `1/t` of the activation to its peer over its own NIC and the receiving
/// stage all-gathers the slices over NVLink; `pp_scatter_gather = false` sends it whole.
/// GPT 22B, TP 8 PP 2 on two DGX A100 (the pipeline hop crosses the nodes), full
/// recomputation as Korthikanti et al.'s baseline: both fidelities are faster with it.
#[test]
fn pipeline_scatter_gather_sends_one_slice_per_tp_rank() {
    use fabricsim::workload::comm::{p2p_bytes, p2p_gather_bytes};
    let m = model("megatron-gpt-22b");
    let f = built("dgx-a100", 2);
    let base = "tp = 8\npp = 2\nsp = false\nmbs = 1\ngbs = 8\nseq = 2048\nrecompute = \"full\"\nattention = \"unfused\"\n";
    let on = plan_text(&m, 16, base);
    let off = plan_text(&m, 16, &format!("{base}pp_scatter_gather = false\n"));
    let sp = plan_text(&m, 16, &base.replace("sp = false", "sp = true"));
    let act = 2 * 2048 * 6144;
    assert!(on.pp_scatter_gather && !off.pp_scatter_gather);
    assert_eq!((p2p_bytes(&m, &on), p2p_gather_bytes(&m, &on)), (act / 8, act));
    assert_eq!((p2p_bytes(&m, &off), p2p_gather_bytes(&m, &off)), (act, 0));
    // Under SP each rank already holds its own slice of the sequence: no gather.
    assert_eq!((p2p_bytes(&m, &sp), p2p_gather_bytes(&m, &sp)), (act / 8, 0));
    let (a_on, _) = step_on_fabric(&f, &m, &on).unwrap();
    let (a_off, _) = step_on_fabric(&f, &m, &off).unwrap();
    let e_on = step_event(&f, &m, &on, &EventOpts::default()).unwrap().estimate;
    let e_off = step_event(&f, &m, &off, &EventOpts::default()).unwrap().estimate;
    assert!(a_on.step_time_s < a_off.step_time_s, "analytical {} vs {}", a_on.step_time_s, a_off.step_time_s);
    assert!(e_on.step_time_s < e_off.step_time_s, "event {} vs {}", e_on.step_time_s, e_off.step_time_s);
    // What moves is the pipeline's part (the whole activation over one NIC against an
    // eighth of it and a gather over NVLink), and the two fidelities agree on it.
    assert!(a_on.breakdown.pp < a_off.breakdown.pp, "{:?} vs {:?}", a_on.breakdown, a_off.breakdown);
    assert!(
        rel_err(e_on.step_time_s, a_on.step_time_s) < 0.06,
        "{} vs {}",
        e_on.step_time_s,
        a_on.step_time_s
    );
}

/// Megatron-LM overlaps pipeline send/recv with compute (`overlap_p2p_comm`) only under the
/// interleaved schedule and forces it off for the others, whose exchanges block the stage:
/// a plan without `pp_comm_overlap` gets that choice, an explicit key wins, and blocking
/// makes a 1F1B step across nodes slower.
#[test]
fn pipeline_overlap_defaults_to_megatrons_choice() {
    let m = model("megatron-gpt-22b");
    let base = "tp = 8\npp = 2\nmbs = 1\ngbs = 8\nseq = 2048\n";
    assert!(!plan_text(&m, 16, base).pp_comm_overlap());
    assert!(plan_text(&m, 16, &format!("{base}vpp = 2\n")).pp_comm_overlap());
    assert!(!plan_text(&m, 16, &format!("{base}vpp = 2\npp_comm_overlap = false\n")).pp_comm_overlap());
    let overlapped = plan_text(&m, 16, &format!("{base}pp_comm_overlap = true\n"));
    assert!(overlapped.pp_comm_overlap());
    // The same rule for a plan built in code (the flags of `train`, the plan search).
    let coded = Plan { tp: 8, pp: 2, dp: 1, mbs: 1, gbs: 8, ..Plan::default() };
    assert!(!coded.pp_comm_overlap());
    assert!(Plan { vpp: 2, ..coded.clone() }.pp_comm_overlap());
    let f = built("dgx-a100", 2);
    let (blocking, _) = step_on_fabric(&f, &m, &plan_text(&m, 16, base)).unwrap();
    let (overlapping, _) = step_on_fabric(&f, &m, &overlapped).unwrap();
    assert!(
        blocking.step_time_s > overlapping.step_time_s,
        "{} vs {}",
        blocking.step_time_s,
        overlapping.step_time_s
    );
}

/// The analytical step prices all-gathers and reduce-scatters of one rank per node (the DP
/// groups of TP x PP plans) in closed form (`concurrent::closed_form_prices`): the closed
/// forms follow the event mode at NCCL's pick (rings up to 16-64 nodes, PAT beyond) on 2 to
/// 128 nodes. At the 80 MB gradient bucket (Megatron's default) within 5% (measured: -4.1%
/// on 2 nodes to +3.8% on 128; PAT on 128 nodes was +64% when its closed form priced every
/// block at the slowest connection of any step); at 20 MB within 16% (PAT on 128 nodes
/// +15%: the event mode hides more of its windows' latencies than the closed form credits).
#[test]
fn closed_form_dp_collectives_follow_the_event_mode() {
    use fabricsim::workload::concurrent::closed_form_prices;
    use fabricsim::workload::search::FabricPricer;
    let mut report = Vec::new();
    let mut worst = [0.0f64; 2];
    for nodes in [2u32, 4, 8, 16, 32, 64, 128] {
        let f = built("superpod-h100", nodes);
        let ranks: Vec<u64> = (0..nodes as u64).map(|i| 8 * i).collect();
        let p = FabricPricer::new(&f);
        for (i, bytes) in [80_000_000u64, 20_000_000].into_iter().enumerate() {
            for kind in [CollectiveKind::ReduceScatter, CollectiveKind::AllGather] {
                let (a, e) = (p.analytic(kind, bytes, &ranks), p.event(kind, bytes, &ranks));
                assert!(a > 0.0 && e > 0.0);
                let err = a / e - 1.0;
                worst[i] = worst[i].max(err.abs());
                report.push(format!(
                    "{nodes} nodes {kind:?} {bytes} B: closed {a:.6} s event {e:.6} s ({:+.1}%)",
                    err * 100.0
                ));
            }
        }
        assert_eq!(closed_form_prices(&f, CollectiveKind::ReduceScatter, &ranks), nodes > 2);
        assert!(!closed_form_prices(&f, CollectiveKind::AllReduce, &ranks));
    }
    let text = report.join("\n");
    assert!(worst[0] <= 0.05, "{text}");
    assert!(worst[1] <= 0.16, "{text}");
}

#[test]
fn event_prices_between_grid_sizes_follow_the_exact_simulation() {
    // `FabricPricer::event` simulates at the nearest of 16 sizes per doubling and scales by
    // the closed form's ratio. On Llama 3 405B's three DP all-reduce sizes (128 ranks, one
    // per SuperPOD node; they share one simulation) and on TP collectives of one node, the
    // result must be the exact size's simulation within 0.5%, and a power of two is simulated
    // exactly.
    use fabricsim::schedule::DType;
    use fabricsim::workload::concurrent::collective_time;
    use fabricsim::workload::search::FabricPricer;
    let f = built("superpod-h100", 128);
    let p = FabricPricer::new(&f);
    let exact = |kind: CollectiveKind, bytes: u64, ranks: &[u64]| {
        let r: Vec<u32> = ranks.iter().map(|&x| x as u32).collect();
        collective_time(&f, p.router(), kind, bytes, &r, &[], DType::BF16, p.policy()).unwrap()
    };
    let dp: Vec<u64> = (0..128u64).map(|i| 8 * i).collect();
    let tp: Vec<u64> = (0..8u64).collect();
    let mut report = Vec::new();
    let mut worst = 0.0f64;
    for (kind, bytes, ranks) in [
        (CollectiveKind::AllReduce, 79_275_580u64, &dp),
        (CollectiveKind::AllReduce, 79_698_330, &dp),
        (CollectiveKind::AllGather, 100_000_000, &tp),
        (CollectiveKind::ReduceScatter, 3_000_000, &tp),
        (CollectiveKind::AllReduce, 5_000_000, &tp),
    ] {
        let (grid, real) = (p.event(kind, bytes, ranks), exact(kind, bytes, ranks));
        let err = grid / real - 1.0;
        worst = worst.max(err.abs());
        report.push(format!(
            "{kind:?} {bytes} B on {}: grid {grid:.6e} exact {real:.6e} ({:+.3}%)",
            ranks.len(),
            err * 100.0
        ));
    }
    assert!(worst <= 0.005, "{}", report.join("\n"));
    assert_eq!(p.priced().1, 4, "the two DP sizes share one simulation:\n{}", report.join("\n"));
    let pow2 = 1u64 << 26;
    assert_eq!(p.event(CollectiveKind::AllReduce, pow2, &tp), exact(CollectiveKind::AllReduce, pow2, &tp));
}

/// The checks a beside-kernel shadow (CP, TP) must pass on 4 DGX H100, with `off` the
/// options without it: `cross` (a group across nodes) is slower with the DP buckets on the
/// same NIC, its breakdown adds up, and with the DP shadows off it is as before within 0.5%;
/// `intra` (the group inside a node) has no such shadow and is the same to the bit. Returns
/// the cross plan's steps with and without the shadows.
fn beside_shadows_contend(
    m: &Model,
    cross: &str,
    intra: &str,
    kind: StepJobKind,
    off: EventOpts,
) -> (fabricsim::workload::lower::EventStep, fabricsim::workload::lower::EventStep) {
    let f = built("dgx-h100", 4);
    let t = |p: &Plan, o: EventOpts| step_event(&f, m, p, &o).unwrap();
    let dp_off = EventOpts { nic_shadows: false, ..EventOpts::default() };
    let cross = plan_text(m, 32, cross);
    let (on, without) = (t(&cross, EventOpts::default()), t(&cross, off));
    let (alone, alone_off) = (t(&cross, dp_off), t(&cross, EventOpts { nic_shadows: false, ..off }));
    let s = |e: &fabricsim::workload::lower::EventStep| e.estimate.step_time_s;
    eprintln!(
        "{kind:?} shadows: {:.5} s against {:.5} s without; DP shadows off: {:.5} / {:.5}",
        s(&on),
        s(&without),
        s(&alone),
        s(&alone_off)
    );
    assert!(on.jobs.iter().any(|j| j.kind == kind));
    assert!(s(&on) > s(&without), "{} vs {}", s(&on), s(&without));
    let b = on.estimate.breakdown;
    assert!(rel_err(b.total(), s(&on)) < 1e-6, "{b:?}");
    assert!(rel_err(s(&alone), s(&alone_off)) < 0.005, "{} vs {}", s(&alone), s(&alone_off));
    let intra = plan_text(m, 32, intra);
    let (a, z) = (t(&intra, EventOpts::default()), t(&intra, off));
    assert!(!a.jobs.iter().any(|j| j.kind == kind));
    assert_eq!(a, z);
    (on, without)
}

/// A TP group across nodes (tp 16 on DGX H100) gets NIC shadows of its collectives beside
/// each layer kernel, as a CP group does (the checks of [`beside_shadows_contend`]).
#[test]
fn cross_node_tp_collectives_contend_with_dp_on_the_nic() {
    beside_shadows_contend(
        &model("megatron-gpt-22b"),
        "tp = 16\ndp = 2\nmbs = 1\ngbs = 2\nseq = 2048\nzero = 1\n",
        "tp = 8\ndp = 4\nmbs = 1\ngbs = 4\nseq = 2048\nzero = 1\n",
        StepJobKind::Tp,
        EventOpts { tp_shadows: false, ..EventOpts::default() },
    );
}

/// A CP group across nodes (tp 8, cp 2 on DGX H100: each CP pair spans two nodes) gets
/// NIC shadows of its KV exchanges beside each layer kernel (the checks of
/// [`beside_shadows_contend`]; inside a node: tp 4, cp 2, the pair GPUs 0 and 4), and the
/// breakdown says where the time went.
#[test]
fn cross_node_cp_exchanges_contend_with_dp_on_the_nic() {
    let (on, off) = beside_shadows_contend(
        &model("llama3-8b"),
        "tp = 8\ncp = 2\ndp = 2\nmbs = 1\ngbs = 2\nseq = 16384\nzero = 1\n",
        "tp = 4\ncp = 2\ndp = 4\nmbs = 1\ngbs = 4\nseq = 16384\nzero = 1\n",
        StepJobKind::Cp,
        EventOpts { cp_shadows: false, ..EventOpts::default() },
    );
    // Here the exchanges keep within their kernels and the DP reduction they share the NIC
    // with ends later: the step's exposed CP and DP grow by what the step grows.
    let (bo, bf) = (on.estimate.breakdown, off.estimate.breakdown);
    let grew = (bo.cp + bo.dp) - (bf.cp + bf.dp);
    let d = on.estimate.step_time_s - off.estimate.step_time_s;
    assert!(rel_err(grew, d) < 0.01, "{bo:?}\n{bf:?}");
}

/// EP all-to-all that leaves the node gets a NIC shadow per layer kernel in the event mode:
/// it queues behind the DP buckets (reduced during the backward) on the representative's
/// NIC, so the step is slower with the DP traffic on the NIC (its shadows on) than without;
/// alone (the DP shadows off, which no longer turns the EP shadows off) the shadows give the
/// step as before within 1%. An EP group inside one node is untouched to the bit.
#[test]
fn cross_node_ep_all_to_all_contends_with_dp_on_the_nic() {
    let m = model("mixtral-8x7b");
    let f = built("dgx-h100", 2);
    let t = |p: &Plan, o: EventOpts| step_event(&f, &m, p, &o).unwrap();
    let dp_off = EventOpts { nic_shadows: false, ..EventOpts::default() };
    let no_ep = EventOpts { ep_shadows: false, ..EventOpts::default() };
    // tp 2, ep 8: the EP group is ranks 0, 2, ..., 14, across both nodes.
    let cross = plan_text(&m, 16, "tp = 2\nep = 8\ndp = 8\nmbs = 1\ngbs = 8\nseq = 2048\nzero = 1\n");
    let (with_dp, without_dp) = (t(&cross, EventOpts::default()), t(&cross, dp_off));
    let before = (t(&cross, no_ep), t(&cross, EventOpts { ep_shadows: false, ..dp_off }));
    let s = |e: &fabricsim::workload::lower::EventStep| e.estimate.step_time_s;
    eprintln!(
        "EP shadows: {:.5} s with DP on the NIC, {:.5} s without; before: {:.5} s / {:.5} s; ep {:.5} / {:.5}",
        s(&with_dp),
        s(&without_dp),
        s(&before.0),
        s(&before.1),
        with_dp.estimate.breakdown.ep,
        without_dp.estimate.breakdown.ep
    );
    assert!(with_dp.jobs.iter().any(|j| j.kind == StepJobKind::Ep));
    assert!(s(&with_dp) > s(&without_dp), "{} vs {}", s(&with_dp), s(&without_dp));
    assert!(with_dp.estimate.breakdown.ep > without_dp.estimate.breakdown.ep);
    let b = with_dp.estimate.breakdown;
    assert!(rel_err(b.total(), s(&with_dp)) < 1e-6, "{b:?}");
    // Alone, the shadows stretch to the all-to-all's time: the step as before within 1%.
    assert!(rel_err(s(&without_dp), s(&before.1)) < 0.01, "{} vs {}", s(&without_dp), s(&before.1));
    // tp 1, ep 8: the EP group is node 0's eight GPUs.
    let intra = plan_text(&m, 16, "tp = 1\nep = 8\ndp = 16\nmbs = 1\ngbs = 16\nseq = 2048\nzero = 1\n");
    let (on, off) = (t(&intra, EventOpts::default()), t(&intra, no_ep));
    assert!(!on.jobs.iter().any(|j| j.kind == StepJobKind::Ep));
    assert_eq!(on, off);
}

/// Where a ZeRO-3 step's layer-by-layer weight gathers outlast the layers' compute (DP 576 on
/// 288 GB200 trays, one GPU of two per CP pair in each gather), the passes wait for them
/// inside: that wait is exposed DP communication, and the breakdown still adds up to the
/// step (it left ~1.85 s of 5.99 s unaccounted before the wait was counted).
#[test]
fn waits_for_weight_gathers_are_exposed_dp_communication() {
    let m = model("llama3-70b");
    let f = built("gb200-nvl72-multirack", 288);
    let p = plan_text(
        &m,
        1152,
        "tp = 1\ncp = 2\ndp = 576\nmbs = 1\ngbs = 1152\nseq = 8192\nzero = 3\nrecompute = \"none\"\n",
    );
    let e = step_event(&f, &m, &p, &EventOpts::default()).unwrap();
    let (b, step) = (e.estimate.breakdown, e.estimate.step_time_s);
    assert!(rel_err(b.total(), step) < 1e-6, "{b:?} against {step} s");
    assert!(b.dp > 0.2 * step, "{b:?}");
}

/// Megatron-Core's MoE all-to-all overlap (`moe_a2a_overlap`, its
/// `--overlap-moe-expert-parallel-comm`): a forward and another micro-batch's backward run
/// merged, each one's dispatch and combine under the other's compute, which slows by the SM
/// share. Mixtral 8x7B with EP 8 laid across two DGX H100 (dp inside ep in the order: EP
/// strides by 2 over both nodes): each op's all-to-alls are shorter than the other pass's
/// compute, so in the closed form all of them hide and what stays exposed is the SM share
/// (0.10 on Hopper) of their time, exactly; the event mode, its EP shadows beside the
/// kernels, agrees within 6%. Without EP the switch is refused, naming itself.
#[test]
fn moe_a2a_overlap_hides_the_all_to_alls_behind_the_other_pass() {
    let m = model("mixtral-8x7b");
    let f = built("dgx-h100", 2);
    let text = "tp = 1\nep = 8\ndp = 16\nmbs = 1\ngbs = 64\nseq = 4096\norder = \"tp-cp-dp-ep-pp\"\n";
    let off = plan_text(&m, 16, text);
    let on = plan_text(&m, 16, &format!("{text}moe_a2a_overlap = true\n"));
    let pl = fabricsim::workload::plan::Placement::new(&on);
    assert_eq!(pl.group_of(GroupKind::Ep, 0), (0..16).step_by(2).collect::<Vec<u64>>());
    let (a_off, _) = step_on_fabric(&f, &m, &off).unwrap();
    let (a_on, _) = step_on_fabric(&f, &m, &on).unwrap();
    let (ep_off, ep_on) = (a_off.breakdown.ep, a_on.breakdown.ep);
    assert!(ep_off > 0.05 * a_off.step_time_s, "EP crosses the nodes: {ep_off} s of {}", a_off.step_time_s);
    assert!(rel_err(ep_on, 0.10 * ep_off) < 1e-9, "exposed {ep_on} s vs 0.10 x {ep_off} s");
    assert_eq!(a_on.breakdown.compute, a_off.breakdown.compute);
    assert!(a_on.step_time_s < a_off.step_time_s - 0.8 * ep_off);
    for (plan, a) in [(&off, &a_off), (&on, &a_on)] {
        let e = step_event(&f, &m, plan, &EventOpts::default()).unwrap();
        let err = rel_err(e.estimate.step_time_s, a.step_time_s);
        assert!(err < 0.06, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a.step_time_s);
    }
    // DeepSeek-V3 on 16 H100 nodes (TP 2, PP 2, EP 64 on 8 whole nodes, expert-TP 1): a
    // forward's all-to-alls outlast its compute, so part stays exposed; the event mode, which
    // runs each op's shadows beside its own kernels (the other pass's SM share on them),
    // agrees within 6% (-3.0%).
    let ds = model("deepseek-v3");
    let f = built("superpod-h100", 16);
    let text = "tp = 2\npp = 2\nep = 64\netp = 1\nmbs = 1\ngbs = 64\nseq = 4096\ndtype = \"fp8\"\n";
    let off = plan_text(&ds, 128, text);
    let on = plan_text(&ds, 128, &format!("{text}moe_a2a_overlap = true\n"));
    let (a_off, _) = step_on_fabric(&f, &ds, &off).unwrap();
    let (a_on, _) = step_on_fabric(&f, &ds, &on).unwrap();
    assert!(a_on.breakdown.ep > 0.2 * a_off.breakdown.ep && a_on.breakdown.ep < 0.5 * a_off.breakdown.ep);
    let e = step_event(&f, &ds, &on, &EventOpts::default()).unwrap();
    let err = rel_err(e.estimate.step_time_s, a_on.step_time_s);
    assert!(err < 0.06, "event {:.4} s vs analytical {:.4} s", e.estimate.step_time_s, a_on.step_time_s);
    // Dense models have no all-to-all to overlap.
    let dense = model("llama3-8b");
    let e = Plan {
        tp: 8,
        dp: 2,
        gbs: 8,
        overlap: Overlap { moe_a2a: true, ..Overlap::default() },
        ..Plan::default()
    }
    .check(&dense, 16)
    .expect_err("no EP");
    assert_eq!(e.field, "moe_a2a_overlap", "{e}");
}

/// Megatron-Core's pipeline layout (`--pipeline-model-parallel-layout`, as Megatron-Bridge's
/// DeepSeek-V3 recipes write it): each virtual stage's layers in model order. The H100
/// recipe's "Et|(tt|)*30mL" gives one layer to the first chunk, two to the next 30 and
/// none to the last but its MTP layer and the output layer: 7, 8 x 6, 6 layers per stage
/// on PP 8 x VP 4. Malformed layouts, and an `m` count other than `mtp_num_layers`, are
/// refused with what is valid, at the key's line.
#[test]
fn pipeline_layouts_follow_megatron_core() {
    use fabricsim::workload::plan::parse_layout;
    let mut want = vec![1u64];
    want.extend([2u64; 30]);
    want.push(0);
    let l = parse_layout("Et|(tt|)*30mL").unwrap();
    assert_eq!((l.layers, l.mtp), (want.clone(), 1));
    assert_eq!(parse_layout("Et|(tt|)*30L").unwrap().layers, want);
    assert_eq!(parse_layout("Et*4|(t*4|)*2t*3L").unwrap().layers, vec![4, 4, 4, 3]);
    assert_eq!(parse_layout("Et*4|t*4mmL").unwrap().mtp, 2);
    for (bad, why) in [
        ("Etm|tL", "`m` (an MTP layer) goes in the last stage"),
        ("Et|tmtL", "`m` (an MTP layer) goes in the last stage"),
        ("t*4|tL", "open with `E`"),
        ("Et|EtL", "`E` (the embedding) opens the first stage"),
        ("EtL|t", "`L` (the output layer) closes the last stage"),
        ("Et*|L", "needs a count"),
        ("Ext|L", "unknown symbol `x`"),
        ("Et)|L", "unbalanced"),
        ("E(t*99999|)*99999L", "more than a million"),
    ] {
        let e = parse_layout(bad).expect_err(bad);
        assert!(e.contains(why), "{bad}: {e}");
    }
    let ds = model("deepseek-v3");
    let text = "tp = 2\npp = 8\nvpp = 4\nep = 64\netp = 1\nmbs = 1\ngbs = 8192\nseq = 4096\n\
                mtp_num_layers = 1\npipeline_model_parallel_layout = \"Et|(tt|)*30mL\"\n";
    let plan = plan_text(&ds, 1024, text);
    assert_eq!(plan.stage_layers(ds.layers), vec![7, 8, 8, 8, 8, 8, 8, 6]);
    assert_eq!(plan.vstage_layers(ds.layers, 31), 61..61);
    // The last chunk's one block is the MTP layer, of the last layer's kind (MoE).
    assert_eq!(plan.vstage_blocks(ds.layers, 31).collect::<Vec<_>>(), vec![60]);
    assert_eq!(plan.vstage_blocks(ds.layers, 30).collect::<Vec<_>>(), vec![59, 60]);
    // A layout of the wrong length or layer count, and one beside explicit stage sizes.
    let m = model("llama3-8b");
    for (layout, why) in [
        ("Et*16|t*16L", "has 2 virtual stages but pp × vpp = 4 × 1 = 4"),
        ("Et*8|t*8|t*8|t*7L", "places 31 transformer layers (t) but the model has 32"),
    ] {
        let t = format!("tp = 2\npp = 4\nmbs = 1\ngbs = 4\npipeline_model_parallel_layout = \"{layout}\"\n");
        let e = parse_plan(&t, Path::new("p.toml"), &m, 8).expect_err(layout).to_string();
        assert!(e.contains("p.toml:5:") && e.contains(why), "{e}");
    }
    let t = "tp = 2\npp = 4\nmbs = 1\ngbs = 4\ndecoder_first_pipeline_num_layers = 8\n\
             pipeline_model_parallel_layout = \"Et*8|t*8|t*8|t*8L\"\n";
    let e = parse_plan(t, Path::new("p.toml"), &m, 8).expect_err("both").to_string();
    assert!(e.contains("p.toml:5:") && e.contains("conflicts with pipeline_model_parallel_layout"), "{e}");
    let t = "tp = 2\npp = 4\nmbs = 1\ngbs = 4\npipeline_model_parallel_layout = \"Et*8|t*8|t*8|t*8mL\"\n";
    let e = parse_plan(t, Path::new("p.toml"), &m, 8).expect_err("mtp").to_string();
    assert!(e.contains("p.toml:5:") && e.contains("places 1 MTP layers (m) but mtp_num_layers = 0"), "{e}");
    let t = "tp = 2\npp = 4\nmbs = 1\ngbs = 4\nmtp_num_layers = 40\n";
    let e = parse_plan(t, Path::new("p.toml"), &m, 8).expect_err("mtp").to_string();
    assert!(e.contains("p.toml:5:") && e.contains("valid: 0 to 32"), "{e}");
}

/// Multi-token prediction (`mtp_num_layers`, Megatron-Core's MTP as DeepSeek-V3 trains it
/// with one layer): on the last pipeline stage, each MTP layer normalises the hidden state
/// and the next token's embedding, projects the two (2h) to h, runs a transformer layer of
/// the last layer's kind and the shared output layer with its loss.
/// - Model FLOPs per sequence rise by 3 × (that layer's forward + 2·s·2h·h + 2·s·h·V), as
///   Megatron-Core's FLOP formula counts them.
/// - With pp > 1 the last stage holds the layer, the projection, its two norms and a copy of
///   the untied embedding. With the output head copy that Hugging Face's checkpoint keeps
///   apart, that is DeepSeek-V3's MTP module of 14B parameters (its model card: 671B main
///   model + 14B MTP).
/// - A last stage that decides the step (Llama 3 8B, 4 + 28 layers) decides it with its MTP
///   layer: the step is 8 × its forward and backward, the first stage's forward and backward
///   once and the optimizer, and that chunk grows by
///   more than one layer (the projection, the second logits and loss).
#[test]
fn mtp_layers_load_the_last_stage() {
    use fabricsim::workload::compute::{chunk_cost, optimizer_time, Roofline};
    use fabricsim::workload::flops::{layer_forward_flops, step_flops};
    use fabricsim::workload::memory::{stage_params, vstage_params};
    use fabricsim::workload::plan::Dtype;
    let ds = model("deepseek-v3");
    let (s, h, v) = (4096u64, ds.hidden, ds.vocab);
    let base = plan_text(&ds, 64, "pp = 2\nep = 32\nmbs = 1\ngbs = 64\nseq = 4096\n");
    let mtp = plan_text(&ds, 64, "pp = 2\nep = 32\nmbs = 1\ngbs = 64\nseq = 4096\nmtp_num_layers = 1\n");
    let want = 64.0
        * 3.0
        * (layer_forward_flops(&ds, 60, 1, s) + (2 * s * 2 * h * h) as f64 + (2 * s * h * v) as f64);
    let got = step_flops(&ds, &mtp).model - step_flops(&ds, &base).model;
    assert!(rel_err(got, want) < 1e-12, "{got} vs {want}");
    // Parameters: EP 32 splits the experts, so count them back.
    let ((d0, e0), (d1, e1)) = (vstage_params(&ds, &base, 1), vstage_params(&ds, &mtp, 1));
    let layer = ds.layer_params(60);
    assert_eq!(d1 - d0, layer.dense() + 2 * h * h + 2 * h + v * h);
    assert_eq!(e1 - e0, layer.expert * layer.routed_experts / 32);
    assert_eq!(vstage_params(&ds, &mtp, 0), vstage_params(&ds, &base, 0), "first stage unchanged");
    let module = (d1 - d0 + 32 * (e1 - e0) + v * h) as f64;
    assert!(rel_err(module, 14e9) < 0.05, "MTP module {:.2}B parameters", module / 1e9);

    let m = model("llama3-8b");
    let g = gpu("dgx-h100.toml");
    let r = Roofline::new(&g, Dtype::Bf16, GpuParams::for_generation(g.generation).unwrap()).unwrap();
    let free = |_: CollectiveKind, _: u64, _: &[u64]| 0.0;
    let plan = |mtp: u64, last: u64| Plan {
        pp: 2,
        gbs: 8,
        seq: Some(2048),
        first_stage_layers: Some(32 - last),
        last_stage_layers: Some(last),
        schedule: Some(Schedule::OneFOneB),
        mtp_layers: mtp,
        ..Plan::default()
    };
    let (p, no) = (plan(1, 28), plan(0, 28));
    p.check(&m, 2).unwrap();
    let (c0, c1) = (chunk_cost(&m, &p, &r, 0, 0), chunk_cost(&m, &p, &r, 1, 0));
    assert!(c1.fwd >= c0.fwd + c0.bwd(), "{c0:?} {c1:?}");
    let opt = (0..2).map(|s| optimizer_time(&r, stage_params(&m, &p, s).0)).fold(0.0, f64::max);
    let e = run("llama3-8b", &p, "dgx-h100.toml", &free);
    // The first stage's forward of the first micro-batch and backward of the last frame it.
    let want = c0.fwd + 8.0 * (c1.fwd + c1.bwd()) + c0.bwd() + opt;
    assert!(rel_err(e.step_time_s, want) < 1e-12, "{} vs {want}", e.step_time_s);
    let total = |c: fabricsim::workload::compute::ChunkCost| c.fwd + c.bwd();
    let grown = total(c1) - total(chunk_cost(&m, &no, &r, 1, 0));
    let one_layer = total(chunk_cost(&m, &plan(0, 29), &r, 1, 0)) - total(chunk_cost(&m, &no, &r, 1, 0));
    let logits = 3.0 * r.gemm_time(2048, m.vocab, m.hidden, 1);
    assert!(grown > one_layer + logits, "{grown} vs {one_layer} + {logits}");
    assert!(e.step_time_s > run("llama3-8b", &no, "dgx-h100.toml", &free).step_time_s);
}

/// Megatron-Core's `recompute_modules` (with `recompute = "selective"`): each named module
/// reruns its forward in the backward and drops what it saved. DeepSeek-V3 with its
/// recipe's mla_up_proj and mlp, closed form: the up-projections of all 61 layers and the
/// MLP GEMMs of the 3 dense layers rerun, and the attention core no longer does; the
/// projected queries, keys and values go from every layer's saved tensors, the MLP's
/// intermediates from the dense layers'.
#[test]
fn recompute_modules_rerun_what_they_name() {
    use fabricsim::workload::compute::{chunk_cost, Roofline};
    use fabricsim::workload::flops::{attention, layer_gemms, step_flops};
    use fabricsim::workload::memory::layer_activation_bytes;
    use fabricsim::workload::plan::{Dtype, RecomputeModule, RecomputeModules};
    let ds = model("deepseek-v3");
    let path = Path::new("plan.toml");
    let base = "pp = 2\nep = 32\nmbs = 1\ngbs = 64\nseq = 4096\nrecompute = \"selective\"\n";
    let core = parse_plan(base, path, &ds, 64).unwrap();
    assert_eq!(core.recompute_modules, RecomputeModules::default());
    let listed =
        parse_plan(&format!("{base}recompute_modules = [\"mla_up_proj\", \"mlp\"]\n"), path, &ds, 64)
            .unwrap();
    let string =
        parse_plan(&format!("{base}recompute_modules = \"mlp,mla_up_proj\"\n"), path, &ds, 64).unwrap();
    assert_eq!(listed, string);
    assert_eq!(
        listed.recompute_modules,
        RecomputeModules::of(&[RecomputeModule::MlaUpProj, RecomputeModule::Mlp])
    );

    // Hardware FLOPs beyond the model's, per step of 64 sequences.
    let s = 4096;
    let gemms = |l: u64, names: &[&str]| -> f64 {
        layer_gemms(&ds, l, s).iter().filter(|g| names.contains(&g.name)).map(|g| g.flops()).sum()
    };
    let dense: Vec<u64> = (0..ds.layers).filter(|&l| !ds.is_moe_layer(l)).collect();
    assert_eq!(dense, [0, 1, 2]);
    assert!(gemms(0, &["mlp_up"]) > 0.0 && gemms(3, &["mlp_up", "mlp_down"]) == 0.0);
    let want: f64 = (0..ds.layers).map(|l| gemms(l, &["q_up", "kv_up", "mlp_up", "mlp_down"])).sum();
    let extra = |p: &Plan| step_flops(&ds, p).hardware - step_flops(&ds, p).model;
    assert!(rel_err(extra(&listed), 64.0 * want) < 1e-12, "{} vs {}", extra(&listed), 64.0 * want);
    let attn = 61.0 * attention(&ds, 1, s).flops_full();
    assert!(rel_err(extra(&core), 64.0 * attn) < 1e-12);

    // Saved activations: t = 4096 tokens, tp 1.
    let t = 4096;
    let mla = ds.mla.as_ref().unwrap();
    let qkv = 2 * t * (ds.q_dim() + ds.kv_dim() + ds.heads * mla.v_head_dim);
    let dropped = |l| layer_activation_bytes(&ds, &core, l) - layer_activation_bytes(&ds, &listed, l);
    assert_eq!(dropped(3), qkv, "an MoE layer drops its queries, keys and values");
    assert_eq!(
        dropped(0),
        qkv + 2 * t * 2 * ds.ffn_hidden + 2 * t * ds.ffn_hidden,
        "a dense one its MLP too"
    );
    let norms = with_modules(&ds, base, "\"layernorm\"");
    let (a, b) = (layer_activation_bytes(&ds, &core, 3), layer_activation_bytes(&ds, &norms, 3));
    assert_eq!(a - b, 2 * 2 * t * ds.hidden, "the two norms' BF16 outputs");

    // Compute: the backward reruns exactly the named GEMMs (stage 0 holds the 3 dense layers).
    let g = gpu("dgx-h100.toml");
    let r = Roofline::new(&g, Dtype::Bf16, GpuParams::for_generation(g.generation).unwrap()).unwrap();
    let (c_core, c_listed) = (chunk_cost(&ds, &core, &r, 0, 0), chunk_cost(&ds, &listed, &r, 0, 0));
    assert_eq!((c_core.fwd, c_core.bwd_weight), (c_listed.fwd, c_listed.bwd_weight));
    assert!(c_listed.bwd_input != c_core.bwd_input, "{c_core:?} {c_listed:?}");
    let none = parse_plan(&base.replace("selective", "none"), path, &ds, 64).unwrap();
    let c_none = chunk_cost(&ds, &none, &r, 0, 0);
    assert!(c_listed.bwd_input > c_none.bwd_input && c_core.bwd_input > c_none.bwd_input);

    // Errors: located, with what would be valid.
    let err = |extra: &str| parse_plan(&format!("{base}{extra}"), path, &ds, 64).unwrap_err().to_string();
    let e = err("recompute_modules = [\"mla_up\"]\n");
    assert!(
        e.starts_with("plan.toml:7:")
            && e.contains("did you mean `mla_up_proj`")
            && e.contains("valid: core_attn"),
        "{e}"
    );
    let e = err("recompute_modules = [\"moe\"]\n");
    assert!(e.contains("`moe`") && e.contains("not modelled"), "{e}");
    let e = err("recompute_modules = []\n");
    assert!(e.contains("recomputes nothing"), "{e}");
    let e = err("recompute_modules = 3\n");
    assert!(e.starts_with("plan.toml:7:") && e.contains("a list of module names"), "{e}");
    let e = parse_plan(
        &format!("{}recompute_modules = [\"mlp\"]\n", base.replace("selective", "full")),
        path,
        &ds,
        64,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("plan.toml:6:") && e.contains("needs recompute = \"selective\""), "{e}");
}

fn with_modules(m: &Model, base: &str, modules: &str) -> Plan {
    parse_plan(&format!("{base}recompute_modules = [{modules}]\n"), Path::new("plan.toml"), m, 64).unwrap()
}

/// ZeRO-3 and FSDP shard an MoE model's expert weights over the expert data-parallel ranks
/// (the memory model always did) and so must gather them before each layer's forward and
/// backward and reduce-scatter their gradients, over that group; until 2026-12-04 only the
/// dense weights were gathered, which made ZeRO-3 with EP 1 the fastest plan `plan` found for
/// DeepSeek-V3 on 256 H100. Mixtral 8x7B, EP 4 DP 16 on two DGX H100: the experts travel
/// over groups of 4, the dense weights over all 16, in both fidelities.
#[test]
fn zero3_gathers_the_experts_over_their_group() {
    use fabricsim::workload::comm::{chunk_gathers, grad_reduces, ParamGather};
    use fabricsim::workload::memory::vstage_params;
    use std::cell::RefCell;
    let m = model("mixtral-8x7b");
    let plan = plan_text(&m, 16, "ep = 4\ndp = 16\nzero = 3\nmbs = 1\ngbs = 16\nseq = 2048\n");
    assert_eq!(plan.expert_dp(), 4);
    let (dense, experts) = vstage_params(&m, &plan, 0);
    assert_eq!(
        chunk_gathers(&m, &plan, 0, 0),
        [
            ParamGather {
                group: GroupKind::FsdpShard,
                ranks: 16,
                bytes: 2 * dense,
                calls: vec![2 * dense / m.layers],
                list: false
            },
            ParamGather {
                group: GroupKind::ExpertShard,
                ranks: 4,
                bytes: 2 * experts,
                calls: vec![2 * experts / m.layers],
                list: false
            }
        ]
    );
    // Per tensor, a layer's experts are its two local experts' fc1 and fc2.
    let per_tensor = plan_text(&m, 16, "ep = 4\ndp = 16\nzero = 3\ngather_unit = \"tensor\"\n");
    let g = chunk_gathers(&m, &per_tensor, 0, 0);
    assert_eq!(g[1].calls.len(), 4, "{:?}", g[1].calls);
    assert_eq!(g[1].calls.iter().sum::<u64>(), 2 * experts / m.layers);
    // A chunk of dense and MoE layers (DeepSeek-V3's first stage: 3 dense, then MoE) takes
    // its commoner kind's dense tensors and its first MoE layer's experts (32 local experts,
    // fc1 and fc2 each), not the first layer's (a dense layer has no experts).
    let ds = model("deepseek-v3");
    let ds_plan =
        plan_text(&ds, 256, "tp = 2\npp = 8\nep = 8\ndp = 16\nzero = 3\ngather_unit = \"tensor\"\n");
    let first: Vec<u64> = ds_plan.vstage_blocks(ds.layers, 0).collect();
    let moe = first.iter().filter(|&&l| ds.is_moe_layer(l)).count();
    assert!(moe > 0 && 2 * moe > first.len(), "{first:?}");
    let g = chunk_gathers(&ds, &ds_plan, 0, 0);
    assert_eq!(g[0].calls.len(), ds.layer_tensors(ds.moe.as_ref().unwrap().dense_layers).0.len());
    assert_eq!(g[1].calls.len(), 64, "{:?}", g[1].calls);
    let pl = Placement::new(&plan);
    assert_eq!(pl.group_of(GroupKind::ExpertShard, 5), pl.group_of(GroupKind::ExpertDp, 5));
    assert_eq!(pl.group_of(GroupKind::ExpertShard, 5).len(), 4);
    // The analytical mode prices a gather of one layer's experts on 4 ranks.
    let calls = RefCell::new(Vec::new());
    let comm = |kind: CollectiveKind, bytes: u64, ranks: &[u64]| {
        calls.borrow_mut().push((kind, bytes, ranks.len()));
        simple_comm(kind, bytes, ranks)
    };
    let with = run("mixtral-8x7b", &plan, "dgx-h100.toml", &comm);
    let layer = 2 * experts / m.layers;
    for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
        assert!(calls.borrow().contains(&(kind, layer, 4)), "{kind:?} {:?}", calls.borrow());
    }
    assert!(with.breakdown.dp > 0.0);

    // FSDP hybrid in shards of 8: the experts shard over 4 x 8 / 16 = 2 ranks, and their
    // gradients are all-reduced across the 2 replicas of each shard.
    let hybrid = plan_text(
        &m,
        16,
        "ep = 4\ndp = 16\nfsdp = \"hybrid\"\nfsdp_shard = 8\nmbs = 1\ngbs = 16\nseq = 2048\n",
    );
    assert_eq!(hybrid.expert_shard_group(), 2);
    let pl = Placement::new(&hybrid);
    assert_eq!(pl.group_of(GroupKind::ExpertShard, 5).len(), 2);
    assert_eq!(pl.group_of(GroupKind::ExpertReplica, 5).len(), 2);
    let (shard, replica) = (pl.group_of(GroupKind::ExpertShard, 5), pl.group_of(GroupKind::ExpertReplica, 5));
    assert_eq!(shard.iter().filter(|r| replica.contains(r)).collect::<Vec<_>>(), [&5]);
    let reduces = grad_reduces(&m, &hybrid, 0);
    let (_, e) = fabricsim::workload::memory::stage_params(&m, &hybrid, 0);
    assert!(
        reduces.iter().any(|r| r.group == GroupKind::ExpertReplica && r.bytes == 2 * e / 2),
        "{reduces:?}"
    );

    // The event mode gathers them too, and agrees with the analytical mode.
    let f = built("dgx-h100", 2);
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let ev = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let expert_jobs = ev.jobs.iter().filter(|j| j.name.starts_with("fsdp expert gather")).count();
    assert_eq!(expert_jobs as u64, 2 * m.layers, "a forward and a backward gather per layer");
    let err = rel_err(ev.estimate.step_time_s, a.step_time_s);
    // (Measured 2026-12-05: 0.625 s against 0.630 s, 0.8%, and 0.626 s with every
    // collective simulated on all its ranks (`replay: false`), since the experts' replayed
    // gathers run on a proxy of their own, beside the dense ones as their NCCL stream does,
    // and the closed form lets a gather that outlasts its layer hide the SM share it costs
    // the layer (0.625 s against 0.664 s, 5.9%, between the two changes).
    // Measured 2026-12-04: 0.645 s against 0.666 s, 3.3%. The event mode runs a layer's
    // dense and expert gathers side by side, each on its communicator's stream; the closed
    // form added them (0.691 s, 6.7%) until it took the longer of the two or their NIC time
    // together, whichever is longer: both leave the node here. Taking only the longer, NIC
    // or not, had put this plan at 0.648 s but other MoE plans 4-7 points further off, where
    // the gathers fill the same NIC. Before, 0.651 s and 5.6% when a layer's gather could
    // overlap the next one's; 0.680 s and 1.4% while the NIC shadows of these gathers were
    // capped and ran long.)
    assert!(err < 0.02, "event {} s vs analytical {} s", ev.estimate.step_time_s, a.step_time_s);

    // FSDP hybrid: each GPU updates its shard of the experts (a half here, over the expert
    // shard group of 2, not a quarter over the 4 expert data-parallel ranks), and the two
    // all-reduces across replicas, one bucket each, are ready when the backward ends in both
    // modes (the closed form once spread them over the backward: 0.54 s against 0.66 s).
    use fabricsim::workload::memory::optimizer_params;
    let (d, e) = fabricsim::workload::memory::stage_params(&m, &hybrid, 0);
    assert_eq!(optimizer_params(&m, &hybrid, 0), d / 8 + e / 2);
    let (ev, an) = event_and_closed_form(&f, &m, &hybrid);
    // (Measured 2026-12-04: 0.685 s against 0.684 s.)
    assert!(rel_err(ev, an) < 0.02, "hybrid: event {ev} s vs analytical {an} s");
}

/// Class folding (whole nodes of a tree standing in for the others, `exec::fold`) lets one
/// representative's send feed every simulated receiver it stands for, a chain of
/// connections; the sender waits for a credit on the chain's first. A credit freed further
/// down the chain did not wake it, so the HSDP gradient all-reduce of 72 GB200s, 9 in each of
/// 8 racks (NVLS-Tree), stalled at 1 GiB ("deadlock: stream of rank 8 on channel 3") and was
/// rerun unfolded (2x-8x the time). It now runs folded to the end, within 0.5% of the
/// unfolded run, and the plan search prices it.
#[test]
fn a_credit_freed_down_a_folded_chain_wakes_its_sender() {
    use fabricsim::collective::{CollArgs, Collective, Knobs};
    use fabricsim::exec::simulate::SimOpts;
    use fabricsim::fabric::Router;
    use fabricsim::schedule::{DType, RedOp};
    use fabricsim::workload::concurrent::{CollectiveJob, Concurrent};
    let f = built("gb200-nvl72-multirack", 144);
    let router = Router::new(&f, 0);
    let ranks: Vec<u32> = (0..72).map(|j| 8 * j).collect();
    let args = CollArgs {
        coll: Collective::AllReduce,
        count: 1 << 29,
        dtype: DType::BF16,
        redop: RedOp::Sum,
        root: 0,
    };
    let run = |opts: &SimOpts| {
        let mut w = Concurrent::new(&f, &router);
        w.add(CollectiveJob {
            name: "hsdp".into(),
            ranks: ranks.clone(),
            args,
            choice: None,
            knobs: Knobs { max_loops: Some(128), ..Knobs::default() },
        })
        .unwrap();
        w.run(opts).unwrap().sim
    };
    let folded = run(&SimOpts::default());
    let exact = run(&SimOpts { fold_ranks: false, ..SimOpts::default() });
    let all = exact.streams;
    // 6 of the 8 racks stand in for the others (2,916 of 3,888 streams); all of them when
    // the folded run stalls and is repeated unfolded.
    assert!(folded.streams < all, "{} of {all} streams simulated", folded.streams);
    let (t, e) = (folded.time.as_secs(), exact.time.as_secs());
    assert!(rel_err(t, e) < 0.005, "folded {t} s, unfolded {e} s");
    // And through the plan search's pricer: NCCL's choice, priced without a failure.
    let pricer = FabricPricer::new(&f);
    let ranks: Vec<u64> = ranks.iter().map(|&r| r as u64).collect();
    assert_eq!(
        pricer.choice(CollectiveKind::AllReduce, 1 << 30, &ranks).map(|c| c.algo),
        Some(Algo::NvlsTree)
    );
    let ev = pricer.event(CollectiveKind::AllReduce, 1 << 30, &ranks);
    assert!(pricer.take_failure().is_none());
    let an = pricer.analytic(CollectiveKind::AllReduce, 1 << 30, &ranks);
    assert!(rel_err(ev, an) < 0.1, "event {ev} s, closed form {an} s");
}

/// Hopper's GEMM shape law is the measured one: cuBLAS BF16 GEMMs on an H200 (the H100's
/// processor; `validate/measurements/2026-12-04-nvidia-h200/`, 29 shapes: thin M, N and K
/// sweeps, Llama 3 70B TP 8 and DeepSeek-V3 expert GEMMs), with the level set by the
/// measurement (the shipped `gemm_eff` is fitted on training runs and absorbs what a lone
/// GEMM does not pay). The shipped `gemm_half_dim` must be the least-squares one (log of the
/// rate) and the law within 15% rms and 10% median of every shape; the former 64 gave 20%
/// and 13.1%.
#[test]
fn hopper_gemm_shape_law_is_the_measured_one() {
    use fabricsim::workload::compute::Roofline;
    use fabricsim::workload::plan::Dtype;
    let path = root().join("validate/measurements/2026-12-04-nvidia-h200/gpu-info/microbench.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    // Latency-bound (1024^3: 8.5 us, under one wave) and power-bound (16384^3) squares aside.
    let pts: Vec<((u64, u64, u64), f64)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() > 4 && f[0] == "gemm" && f[1] == "bfloat16").then_some(())?;
            let d: Vec<u64> = f[2].split('x').map(|x| x.parse().unwrap()).collect();
            Some(((d[0], d[1], d[2]), f[4].parse::<f64>().unwrap()))
        })
        .filter(|&((m, n, k), _)| !(m == n && n == k && (m == 1024 || m == 16384)))
        .collect();
    assert_eq!(pts.len(), 29, "{}", path.display());
    let g = gpu("dgx-h100.toml");
    let shipped = GpuParams::for_generation(g.generation).unwrap();
    // rms of log(measured / law) and median |law / measured - 1|, the level fitted.
    let fit = |d: f64| {
        let r = Roofline::new(&g, Dtype::Bf16, shipped.with("gemm_half_dim", d)).unwrap();
        let logs: Vec<f64> = pts.iter().map(|&((m, n, k), v)| (v / r.gemm_eff(m, n, k)).ln()).collect();
        let mean = logs.iter().sum::<f64>() / logs.len() as f64;
        let rms = (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / logs.len() as f64).sqrt();
        let mut errs: Vec<f64> = logs.iter().map(|l| ((mean - l).exp() - 1.0).abs()).collect();
        errs.sort_by(f64::total_cmp);
        (rms, errs[errs.len() / 2])
    };
    let d = shipped.gemm_half_dim;
    let best = (8..100).map(|i| f64::from(i) * 4.0).min_by(|&a, &b| fit(a).0.total_cmp(&fit(b).0)).unwrap();
    assert!((d - best).abs() <= 4.0, "shipped gemm_half_dim {d}, least squares {best}");
    let (rms, median) = fit(d);
    assert!(rms < 0.15 && median < 0.10, "rms {rms:.3}, median {median:.3}");
    let (rms64, median64) = fit(64.0);
    assert!(rms64 > 0.19 && median64 > 0.13, "the former law: rms {rms64:.3}, median {median64:.3}");
}

/// A fused attention kernel's backward block costs `attention_bwd` forward blocks, per
/// generation (cuDNN's 3.03 measured on an H200 for Hopper, FlashAttention-2's five matmuls
/// to two, 2.5, for Ampere), and a profile may set it; a value that is not positive is an
/// error naming the key.
#[test]
fn attention_backward_costs_the_generations_forwards() {
    use fabricsim::workload::compute::{layer_ops, OpKind, Roofline};
    use fabricsim::workload::plan::Dtype;
    let m = model("llama3-70b");
    let plan = llama70_plan();
    for (topo, bwd) in [("dgx-h100.toml", 3.03), ("dgx-a100.toml", 2.5)] {
        let g = gpu(topo);
        let p = GpuParams::for_generation(g.generation).unwrap();
        assert_eq!(p.attention_bwd, bwd, "{topo}");
        let att = |v: f64| {
            let r = Roofline::new(&g, Dtype::Bf16, p.with("attention_bwd", v)).unwrap();
            layer_ops(&m, &plan, &r, 0).into_iter().find(|o| o.kind == OpKind::Attention).unwrap()
        };
        let (two, four) = (att(2.0), att(4.0));
        assert_eq!(two.fwd, four.fwd, "{topo}");
        assert!(
            rel_err(four.bwd_input, 2.0 * two.bwd_input) < 1e-12,
            "{topo}: {} vs {}",
            four.bwd_input,
            two.bwd_input
        );
    }
    let spec = load_topology(&root().join("topologies/dgx-h100.toml")).unwrap();
    let bad: toml::Table = toml::from_str("[compute]\nattention_bwd = 0.0").unwrap();
    let err =
        build(&spec, &BuildOpts { nodes: Some(1), gpus_per_node: None, params: Some(bad) }).unwrap_err();
    assert!(err.to_string().contains("compute.attention_bwd = 0 must be positive"), "{err}");
    let bad: toml::Table = toml::from_str("[compute]\nattention_tile_fwd = -1.0").unwrap();
    let err =
        build(&spec, &BuildOpts { nodes: Some(1), gpus_per_node: None, params: Some(bad) }).unwrap_err();
    assert!(err.to_string().contains("compute.attention_tile_fwd = -1 must be 0 or more"), "{err}");
}

/// Hopper's fused attention law is the measured one: cuDNN's causal attention on an H200
/// (`validate/measurements/2026-12-04-nvidia-h200/gpu-info/attention.csv`, five shapes of
/// 2,048-16,384 tokens and 8-48 sequence-heads) runs at 0.46-0.66 of the peak forward. The
/// model deals 128-query tiles (128-key tiles in the backward) to the 132 SMs in launch
/// order, each tile paying `attention_tile_fwd` (`_bwd`) blocks besides its own: with the
/// level free, its shape law is within 4% rms of the forward and 5% of the backward, where
/// one number per pass (the model before) was 15% and 20% off; the shipped tile costs are
/// the least-squares ones, and the shipped level keeps the forward's measured ratio to the
/// 8192^3 GEMM measured beside it (0.728 / 0.822) at the fitted `gemm_eff`.
#[test]
fn hopper_attention_shape_law_is_the_measured_one() {
    use fabricsim::workload::compute::{AttentionKernel, Roofline};
    use fabricsim::workload::plan::Dtype;
    let path = root().join("validate/measurements/2026-12-04-nvidia-h200/gpu-info/attention.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    // (kernel, forward fraction of the peak, forward + backward fraction), cuDNN rows.
    let mut pts: Vec<(AttentionKernel, f64, f64)> = Vec::new();
    for l in text.lines().filter(|l| l.starts_with("CUDNN_ATTENTION,")) {
        let f: Vec<&str> = l.split(',').collect();
        let n = |i: usize| f[i].parse::<u64>().unwrap();
        let k = AttentionKernel { units: n(2) * n(3), q: n(5), kv: n(5), width: 2 * n(6), causal: true };
        let frac: f64 = f[10].parse().unwrap();
        match f[7] {
            "fwd" => pts.push((k, frac, 0.0)),
            _ => pts.iter_mut().find(|p| p.0 == k).unwrap().2 = frac,
        }
    }
    assert_eq!(pts.len(), 5, "{}", path.display());
    let g = gpu("dgx-h100.toml");
    assert_eq!(g.sm_count, 132);
    let p = GpuParams::for_generation(g.generation).unwrap();
    // The measured fractions count the causal triangle; the backward's is 2.5 forwards.
    let useful = |k: &AttentionKernel| (k.units * k.q * k.kv) as f64 / 2.0 / (128.0 * 128.0);
    let measured = |bwd: bool, pt: &(AttentionKernel, f64, f64)| {
        if bwd {
            2.5 / (3.5 / pt.2 - 1.0 / pt.1)
        } else {
            pt.1
        }
    };
    // rms of log(measured / law), the level free, for a tile cost `c`; and the level.
    let fit = |bwd: bool, c: f64| {
        let logs: Vec<f64> = pts
            .iter()
            .map(|pt| {
                let law = useful(&pt.0) / pt.0.makespan(bwd, c, g.sm_count);
                (measured(bwd, pt) / law).ln()
            })
            .collect();
        let mean = logs.iter().sum::<f64>() / 5.0;
        ((logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 5.0).sqrt(), mean.exp())
    };
    let one_number = |bwd: bool| {
        let logs: Vec<f64> = pts.iter().map(|pt| measured(bwd, pt).ln()).collect();
        let mean = logs.iter().sum::<f64>() / 5.0;
        (logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / 5.0).sqrt()
    };
    for (bwd, c, bound, before) in
        [(false, p.attention_tile_fwd, 0.04, 0.15), (true, p.attention_tile_bwd, 0.05, 0.20)]
    {
        let best =
            (0..200).map(|i| f64::from(i) * 0.05).min_by(|&a, &b| fit(bwd, a).0.total_cmp(&fit(bwd, b).0));
        assert!((c - best.unwrap()).abs() <= 0.1, "bwd {bwd}: shipped tile cost {c}, least squares {best:?}");
        assert!(fit(bwd, c).0 < bound, "bwd {bwd}: rms {:.3}", fit(bwd, c).0);
        assert!(one_number(bwd) > before, "bwd {bwd}: one number {:.3}", one_number(bwd));
    }
    // Levels: the forward's inner loop at 0.728 of the peak, the backward's 2.5/3.03 of it.
    let (fwd_level, bwd_level) = (fit(false, p.attention_tile_fwd).1, fit(true, p.attention_tile_bwd).1);
    assert!(rel_err(fwd_level, 0.728) < 0.01, "forward level {fwd_level:.3}");
    assert!(
        rel_err(p.attention_bwd, 2.5 * fwd_level / bwd_level) < 0.01,
        "attention_bwd {}",
        p.attention_bwd
    );
    assert!(
        rel_err(p.attention_eff, fwd_level / 0.822 * p.gemm_eff) < 0.02,
        "attention_eff {}",
        p.attention_eff
    );
    // The roofline prices the measured shapes within 4% (forward) of the measurement scaled
    // to the fitted level.
    let r = Roofline::new(&g, Dtype::Bf16, p).unwrap();
    for pt in &pts {
        let (fwd, _) = r.attention_times(&pt.0);
        let frac = useful(&pt.0) * pt.0.block_flops() / (fwd * g.flops.bf16);
        let expect = pt.1 * p.attention_eff / fwd_level;
        assert!(rel_err(frac, expect) < 0.045, "{:?}: {frac:.3} vs {expect:.3}", pt.0);
    }
}

#[test]
fn groups_meet_their_copies_on_a_pcie_servers_links() {
    // On a PCIe server (8 L40S, 2 NICs, no NVLink) the DP group of TP rank 0 shares the two
    // NICs with the DP groups of TP ranks 1 to 3, which run the same collectives at the same
    // time; simulated alone it had both NICs to itself, and the event mode put a ZeRO-3 step
    // at half the closed form's DP time (0.37 s against 0.80 s). A DGX's GPUs have a NIC and
    // NVLink ports each: no copies there.
    use fabricsim::workload::search::FabricPricer;
    let f = built("pcie-8gpu", 2);
    let p = FabricPricer::new(&f);
    let one_stage = |_: u64| Some(0);
    let dp: Vec<u64> = vec![0, 4, 8, 12];
    assert_eq!(p.shared_copies(&dp, one_stage), vec![1, 2, 3]);
    assert_eq!(p.shared_copies(&[5, 13], one_stage), vec![1, -1, 2, -2, -3, -4, -5]);
    // Inside the node too (its PCIe switches and the inter-socket link), not across stages.
    assert_eq!(p.shared_copies(&[0, 4], one_stage), vec![1, 2, 3]);
    assert_eq!(p.shared_copies(&[0, 4], |r| Some(r % 2)), vec![2]);
    assert!(p.shared_copies(&dp, |r| (r % 4 == 0).then_some(0)).is_empty());
    let dgx = built("dgx-h100", 2);
    assert!(FabricPricer::new(&dgx).shared_copies(&[0, 8], one_stage).is_empty());

    // Beside its copies the gather needs at least the node's NIC bandwidth shared by its 8
    // GPUs (the closed form's NIC time), which alone it beat by far.
    let bytes = 1 << 30;
    let kind = CollectiveKind::AllGather;
    let (alone, beside) = (p.event(kind, bytes, &dp), p.event_beside(kind, bytes, &dp, &[1, 2, 3]));
    let nic = p.nic(kind, bytes, &dp);
    eprintln!("all-gather of 1 GiB on 4 ranks of 2 PCIe servers: alone {alone:.4} s, beside its copies {beside:.4} s, NIC time {nic:.4} s");
    assert!(alone < 0.6 * nic && beside >= nic, "alone {alone} s, beside {beside} s, NIC {nic} s");
    // Four CP pairs across the sockets share the inter-socket link.
    let pair = [0u64, 4];
    let (alone, beside) = (
        p.event(CollectiveKind::SendRecv, bytes, &pair),
        p.event_beside(CollectiveKind::SendRecv, bytes, &pair, &[1, 2, 3]),
    );
    eprintln!("send/recv of 1 GiB across the sockets: alone {alone:.4} s, beside 3 copies {beside:.4} s");
    assert!(beside > 1.1 * alone, "alone {alone} s, beside {beside} s");

    // The closed form, the replayed event mode and the full simulation agree on a ZeRO-3 step.
    let m = model("llama3-8b");
    let plan = plan_text(
        &m,
        16,
        "tp = 4\nzero = 3\nmbs = 1\ngbs = 4\nseq = 4096\noverlap_grad_reduce = false\noverlap_param_gather = false\n",
    );
    let (a, _) = step_on_fabric(&f, &m, &plan).unwrap();
    let e = step_event(&f, &m, &plan, &EventOpts::default()).unwrap();
    let full = step_event(&f, &m, &plan, &EventOpts { replay: false, ..EventOpts::default() }).unwrap();
    let (a, e, full) = (a.step_time_s, e.estimate.step_time_s, full.estimate.step_time_s);
    eprintln!("ZeRO-3 step: closed form {a:.4} s, event {e:.4} s, full simulation {full:.4} s");
    assert!(rel_err(e, full) < 0.01 && rel_err(a, full) < 0.03, "{a} {e} {full}");

    // One rank per node (TP 8): the closed form prices such groups alone, so with copies
    // they are simulated (ZeRO-2 on 3 servers: closed form 0.03 s of DP against the event
    // mode's 0.47 s before, on Nemotron-4 15B).
    let f = built("pcie-8gpu", 3);
    let plan = plan_text(
        &m,
        24,
        "tp = 8
zero = 2
mbs = 1
gbs = 3
seq = 2048
",
    );
    let (e, a) = event_and_closed_form(&f, &m, &plan);
    eprintln!("ZeRO-2, one rank per node: closed form {a:.4} s, event {e:.4} s");
    assert!(rel_err(a, e) < 0.03, "closed form {a} s, event {e} s");
}

#[test]
fn a_layers_exchanges_wait_for_its_weights() {
    // ZeRO-3 without prefetching, CP across nodes: a layer's ring-attention exchanges need
    // its gathered weights, as its kernel does. Their shadow started when the previous layer
    // ended, beside the gather on the same NIC, and the event mode took 23% longer than the
    // closed form, which runs the gather and then the layer (0.398 s against 0.323 s).
    let f = built("gcp-a3-ultra", 8);
    let m = model("llama2-7b");
    let text = "tp = 4\ncp = 8\nzero = 3\nmbs = 1\ngbs = 2\nseq = 16384\nrecompute = \"selective\"\n\
                overlap_param_gather = false\n";
    let plan = plan_text(&m, 64, text);
    let (e, a) = event_and_closed_form(&f, &m, &plan);
    eprintln!("event {e:.4} s, closed form {a:.4} s ({:+.1}%)", 100.0 * (e / a - 1.0));
    assert!(rel_err(e, a) < 0.05, "event {e} s, closed form {a} s");
}
