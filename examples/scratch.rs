use fabricsim::collective::*;
use fabricsim::exec::simulate::*;
use fabricsim::fabric::{self, build::BuildOpts, Router};
use fabricsim::schedule::*;
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let topo = &args[1];
    let nodes: u32 = args[2].parse().unwrap();
    let algo = Algo::parse(&args[3]).unwrap();
    let proto = Proto::parse(&args[4]).unwrap();
    let nch: u32 = args[5].parse().unwrap();
    let g: u32 = args.get(6).map(|s| s.parse().unwrap()).unwrap_or(1);
    let coll = Collective::parse(args.get(7).map(|s| s.as_str()).unwrap_or("allreduce")).unwrap();
    let minb: u64 = args.get(8).map(|s| s.parse().unwrap()).unwrap_or(8);
    let spec = fabric::load_topology(std::path::Path::new(topo)).unwrap();
    let f = fabric::build::build(&spec, &BuildOpts { nodes: Some(nodes), ..Default::default() }).unwrap();
    let r = Router::new(&f, 0);
    let comm = Comm::from_fabric(&f, &r);
    let n = comm.nranks;
    let mut size = minb;
    while size <= 8 << 30 {
        let per = match coll { Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => size / 4 / n as u64, _ => size / 4 };
        let a = CollArgs { coll, count: per, dtype: DType::F32, redop: RedOp::Sum, root: 0 };
        let s = build_schedule(&comm, &a, &Choice { algo, proto, nchannels: nch }, &Knobs::default()).unwrap();
        fabricsim::schedule::validate::check(&s).unwrap();
        let t0 = std::time::Instant::now();
        let res = simulate(&f, &r, &s, &SimOpts { gpus_per_thread: g, ..Default::default() }).unwrap();
        let us = res.time.as_us();
        let sz = a.size_bytes(n);
        let algbw = sz as f64 / us / 1e3;
        println!("{:>12} {:>10.2} {:>8.2} {:>8.2}  ev={} wall={:?}", sz, us, algbw, algbw * coll.busbw_factor(n), res.events, t0.elapsed());
        size *= 4;
    }
}
