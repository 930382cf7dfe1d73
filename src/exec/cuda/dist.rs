//! A GPU plan split among processes: what each process of a (multi-node) launch enqueues.
//! Each process owns some of the plan's devices; a plan copy whose source and destination
//! live in different processes becomes a *transfer*, an NCCL send on the source's process
//! and the matching receive on the destination's (one NCCL rank per device, the device's
//! global index); every other op stays a local op of the process owning its stream's
//! device, executed exactly as on one node. A single process owning every device is the
//! single-node case: no transfer, the plan's ops in order.
//!
//! # Order, and why NCCL cannot deadlock on it
//!
//! Every process enqueues its items in the plan's op order, which is an order the schedule
//! allows (the reference interpreter recorded it). Transfer halves run on one NCCL stream
//! per device (NCCL serialises one communicator's work anyway) and consecutive halves of a
//! process are grouped (`ncclGroupStart`/`End`) as long as none waits for another of the
//! same group. So the k-th send from device a to device b and the k-th receive on b from a
//! are the same transfer (both sides list transfers in plan order), and the earliest
//! unfinished op of the plan always has everything it waits for done and its stream(s)
//! at it, on both sides: execution always progresses. [`emulate`] runs a split plan on host
//! arrays under random orders with NCCL's blocking semantics (a group's kernel finishes only
//! when every transfer in it has met its partner) and reports a deadlock if one could occur.
//!
//! # Waits
//!
//! A plan wait names an op; after the split it names a *point*: a local op, or the NCCL
//! group (on one device) holding the waited transfer's half in the waiter's process. A
//! half waits for the points of its own side. Moving a transfer's half off its plan stream
//! loses the plan stream's order, so the local half also waits for the stream's previous
//! local op, and the stream's next local op waits for the half.
//!
//! GPU-free: always built and tested.

use std::collections::{BTreeMap, VecDeque};

use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

use super::plan::{host_memory, host_results, run_host_op, Action, GpuPlan, PlanError, Region};
use crate::exec::cpu::{Buffers, Element, ExecError, PartBuffers};

/// Something a wait can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Point {
    /// A local plan op (an event recorded on its stream after it).
    Op(u32),
    /// An NCCL group's work on one device (an event recorded on that device's NCCL stream).
    Group {
        /// Index into [`DistPlan::groups`].
        group: u32,
        /// Global device.
        device: u32,
    },
}

/// A plan copy between processes.
#[derive(Clone, Debug, PartialEq)]
pub struct Transfer {
    /// The plan op.
    pub op: u32,
    /// Source (on `from`).
    pub src: Region,
    /// Destination (on `to`).
    pub dst: Region,
    /// Sending device (its NCCL rank).
    pub from: u32,
    /// Receiving device (its NCCL rank).
    pub to: u32,
}

/// One side of a transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct Half {
    /// Index into [`DistPlan::transfers`].
    pub transfer: u32,
    /// A send (else a receive).
    pub send: bool,
    /// The device it runs on (global).
    pub device: u32,
    /// The other device (its NCCL rank).
    pub peer: u32,
    /// What it reads (send) or writes (receive).
    pub region: Region,
    /// Points of its own process that must be done first.
    pub waits: Vec<Point>,
}

/// Halves a process issues in one `ncclGroupStart`/`ncclGroupEnd`.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The process.
    pub process: u32,
    /// Its halves, in plan order.
    pub halves: Vec<Half>,
}

impl Group {
    /// The devices it runs on, ascending.
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.halves.iter().map(|h| h.device).collect();
        d.sort_unstable();
        d.dedup();
        d
    }
}

/// What a process enqueues, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// A local plan op, after waiting for `waits`.
    Op {
        /// The plan op.
        op: u32,
        /// Points of this process that must be done first.
        waits: Vec<Point>,
    },
    /// An NCCL group.
    Group(u32),
}

/// One process's share.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcPlan {
    /// Global devices it owns, ascending.
    pub devices: Vec<u32>,
    /// What it enqueues, in order.
    pub items: Vec<Item>,
}

/// A plan split among processes.
#[derive(Clone, Debug, PartialEq)]
pub struct DistPlan {
    /// The plan.
    pub plan: GpuPlan,
    /// Process owning each device.
    pub process_of_device: Vec<u32>,
    /// Copies between processes.
    pub transfers: Vec<Transfer>,
    /// NCCL groups.
    pub groups: Vec<Group>,
    /// Per process.
    pub procs: Vec<ProcPlan>,
    /// Points some wait names (the executor records events only there).
    pub waited: Vec<Point>,
}

impl DistPlan {
    /// Whether point `p` is waited for.
    pub fn is_waited(&self, p: Point) -> bool {
        self.waited.binary_search(&p).is_ok()
    }

    /// Checks what NCCL needs of point-to-point order: for every ordered pair of devices,
    /// the sends of one and the receives of the other list the same transfers in the same
    /// order (each process's groups taken in its enqueue order), with the same length; no
    /// half waits for a group that is not before its own.
    pub fn check_matching(&self) -> Result<(), String> {
        let mut sends: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        let mut recvs: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        for (p, pp) in self.procs.iter().enumerate() {
            for it in &pp.items {
                let Item::Group(g) = it else { continue };
                let g = &self.groups[*g as usize];
                if g.process as usize != p {
                    return Err(format!("process {p} lists a group of process {}", g.process));
                }
                for h in &g.halves {
                    let t = &self.transfers[h.transfer as usize];
                    if h.send {
                        sends.entry((t.from, t.to)).or_default().push(h.transfer);
                    } else {
                        recvs.entry((t.from, t.to)).or_default().push(h.transfer);
                    }
                    if t.src.len != t.dst.len {
                        return Err(format!(
                            "transfer {} sends {} elements into {}",
                            h.transfer, t.src.len, t.dst.len
                        ));
                    }
                }
            }
        }
        if sends != recvs {
            for (k, v) in &sends {
                if recvs.get(k) != Some(v) {
                    return Err(format!(
                        "device {} sends transfers {v:?} to device {} but it receives {:?}",
                        k.0,
                        k.1,
                        recvs.get(k)
                    ));
                }
            }
            return Err("some device receives what nobody sends".into());
        }
        Ok(())
    }
}

/// Splits `plan` among processes, device d belonging to process `process_of_device[d]`.
pub fn split(plan: GpuPlan, process_of_device: &[u32]) -> Result<DistPlan, PlanError> {
    if process_of_device.len() != plan.devices as usize {
        return Err(PlanError::Placement(format!(
            "the plan has {} devices but {} have a process",
            plan.devices,
            process_of_device.len()
        )));
    }
    let nprocs = process_of_device.iter().copied().max().map_or(0, |p| p + 1);
    let dev_of = |r: &Region| plan.buffers[r.buffer as usize].device;
    let proc_of = |d: u32| process_of_device[d as usize];
    // Per op: Some(transfer index) when it crosses processes.
    let mut op_transfer: Vec<Option<u32>> = vec![None; plan.ops.len()];
    let mut transfers = Vec::new();
    for (i, op) in plan.ops.iter().enumerate() {
        let sdev = plan.streams[op.stream as usize].device;
        match &op.action {
            Action::Copy { src, dst } if proc_of(dev_of(src)) != proc_of(dev_of(dst)) => {
                op_transfer[i] = Some(transfers.len() as u32);
                transfers.push(Transfer {
                    op: i as u32,
                    src: *src,
                    dst: *dst,
                    from: dev_of(src),
                    to: dev_of(dst),
                });
            }
            Action::Copy { src, dst } => {
                if proc_of(dev_of(src)) != proc_of(sdev) || proc_of(dev_of(dst)) != proc_of(sdev) {
                    return Err(PlanError::Placement(format!(
                        "plan op {i} copies between devices of one process from a stream of another"
                    )));
                }
            }
            Action::Reduce { inputs, dst, .. } => {
                if inputs.iter().chain(std::iter::once(dst)).any(|r| dev_of(r) != sdev) {
                    return Err(PlanError::Placement(format!(
                        "plan op {i} reduces memory of another device"
                    )));
                }
            }
        }
    }
    let mut procs: Vec<ProcPlan> = (0..nprocs)
        .map(|p| ProcPlan {
            devices: (0..plan.devices).filter(|&d| proc_of(d) == p).collect(),
            items: Vec::new(),
        })
        .collect();
    let mut groups: Vec<Group> = Vec::new();
    // Per transfer: the group of its send half and of its receive half.
    let mut half_group: Vec<[u32; 2]> = vec![[u32::MAX; 2]; transfers.len()];
    let mut open: Vec<Option<u32>> = vec![None; nprocs as usize];
    let nstreams = plan.streams.len();
    // Per plan stream: its last local op, and its last transfer (whose half on the
    // stream's process the next local op must wait for).
    let mut last_local: Vec<Option<u32>> = vec![None; nstreams];
    let mut last_split: Vec<Option<u32>> = vec![None; nstreams];
    let point_on = |w: u32, p: u32, half_group: &[[u32; 2]]| -> Result<Option<Point>, PlanError> {
        match op_transfer[w as usize] {
            None => {
                let d = plan.streams[plan.ops[w as usize].stream as usize].device;
                Ok((proc_of(d) == p).then_some(Point::Op(w)))
            }
            Some(t) => {
                let tr = &transfers[t as usize];
                Ok(if proc_of(tr.from) == p {
                    Some(Point::Group { group: half_group[t as usize][0], device: tr.from })
                } else if proc_of(tr.to) == p {
                    Some(Point::Group { group: half_group[t as usize][1], device: tr.to })
                } else {
                    None
                })
            }
        }
    };
    for (i, op) in plan.ops.iter().enumerate() {
        let i = i as u32;
        let s = op.stream as usize;
        let sdev = plan.streams[s].device;
        match op_transfer[i as usize] {
            None => {
                let p = proc_of(sdev);
                open[p as usize] = None;
                let mut waits = Vec::new();
                for &w in &op.waits {
                    match point_on(w, p, &half_group)? {
                        Some(pt) => waits.push(pt),
                        None => {
                            return Err(PlanError::Placement(format!(
                                "plan op {i} on process {p} waits for op {w} of another process"
                            )))
                        }
                    }
                }
                if let Some(t) = last_split[s].take() {
                    waits.extend(point_on(transfers[t as usize].op, p, &half_group)?);
                }
                waits.sort_unstable();
                waits.dedup();
                procs[p as usize].items.push(Item::Op { op: i, waits });
                last_local[s] = Some(i);
            }
            Some(t) => {
                let tr = transfers[t as usize].clone();
                if tr.from != sdev && tr.to != sdev {
                    return Err(PlanError::Placement(format!(
                        "plan op {i} copies between devices {} and {} from a stream on device {sdev}",
                        tr.from, tr.to
                    )));
                }
                for (k, send) in [(0usize, true), (1usize, false)] {
                    let (device, peer, region) =
                        if send { (tr.from, tr.to, tr.src) } else { (tr.to, tr.from, tr.dst) };
                    let p = proc_of(device);
                    let mut waits = Vec::new();
                    for &w in &op.waits {
                        // A wait of the other side's process belongs to the other half.
                        waits.extend(point_on(w, p, &half_group)?);
                    }
                    if device == sdev {
                        // This half stands in for the op on its plan stream (the stream's
                        // earlier transfers are before it on the device's NCCL stream).
                        if let Some(l) = last_local[s] {
                            waits.push(Point::Op(l));
                        }
                    }
                    waits.sort_unstable();
                    waits.dedup();
                    // A group's halves run concurrently: one that waits for the open group,
                    // or touches memory a half of it writes (or writes what one reads; the
                    // plan leaves such order implicit within one stream), starts a new one.
                    let joins = |gi: u32| {
                        !waits.iter().any(|w| matches!(w, Point::Group { group, .. } if *group == gi))
                            && !groups[gi as usize]
                                .halves
                                .iter()
                                .any(|h| (!h.send || !send) && overlaps(&h.region, &region))
                    };
                    let g = match open[p as usize] {
                        Some(g) if joins(g) => g,
                        _ => {
                            let g = groups.len() as u32;
                            groups.push(Group { process: p, halves: Vec::new() });
                            procs[p as usize].items.push(Item::Group(g));
                            open[p as usize] = Some(g);
                            g
                        }
                    };
                    groups[g as usize].halves.push(Half { transfer: t, send, device, peer, region, waits });
                    half_group[t as usize][k] = g;
                }
                last_split[s] = Some(t);
            }
        }
    }
    let mut waited: Vec<Point> = Vec::new();
    for pp in &procs {
        for it in &pp.items {
            match it {
                Item::Op { waits, .. } => waited.extend(waits.iter().copied()),
                Item::Group(g) => {
                    for h in &groups[*g as usize].halves {
                        waited.extend(h.waits.iter().copied());
                    }
                }
            }
        }
    }
    waited.sort_unstable();
    waited.dedup();
    Ok(DistPlan { plan, process_of_device: process_of_device.to_vec(), transfers, groups, procs, waited })
}

fn overlaps(a: &Region, b: &Region) -> bool {
    a.buffer == b.buffer && a.offset < b.end() && b.offset < a.end()
}

/// Devices in blocks of `per_process`: device d belongs to process d / per_process.
pub fn blocks(devices: u32, per_process: u32) -> Vec<u32> {
    (0..devices).map(|d| d / per_process.max(1)).collect()
}

/// Runs a split plan on host arrays as the processes and NCCL would, in a random order
/// (from `seed`) that respects only what the GPUs guarantee: each plan stream and each
/// device's NCCL stream in order, every wait, and NCCL's blocking point-to-point (a group's
/// work on a device starts when its stream reaches it and its halves' waits are done; a
/// transfer moves its data once both halves have started; the group's work is done when all
/// its transfers have moved). A state where nothing can move is reported as a deadlock.
pub fn emulate<T: Element>(
    d: &DistPlan,
    init: Vec<Vec<Buffers<T>>>,
    seed: u64,
) -> Result<PartBuffers<T>, ExecError> {
    let plan = &d.plan;
    let shape: Vec<usize> = init.iter().map(Vec::len).collect();
    let mut mem = host_memory(plan, init)?;
    // Units: local ops on plan streams, and (group, device) on device NCCL streams.
    #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
    enum Unit {
        Op(u32),
        G(u32, u32),
    }
    let mut queues: Vec<VecDeque<Unit>> = vec![VecDeque::new(); plan.streams.len() + plan.devices as usize];
    for pp in &d.procs {
        for it in &pp.items {
            match it {
                Item::Op { op, .. } => {
                    queues[plan.ops[*op as usize].stream as usize].push_back(Unit::Op(*op))
                }
                Item::Group(g) => {
                    for dev in d.groups[*g as usize].devices() {
                        queues[plan.streams.len() + dev as usize].push_back(Unit::G(*g, dev));
                    }
                }
            }
        }
    }
    let mut op_waits: BTreeMap<u32, &Vec<Point>> = BTreeMap::new();
    for pp in &d.procs {
        for it in &pp.items {
            if let Item::Op { op, waits } = it {
                op_waits.insert(*op, waits);
            }
        }
    }
    let mut done: std::collections::BTreeSet<Point> = Default::default();
    // Started (group, device) units and moved transfers.
    let mut started: std::collections::BTreeSet<(u32, u32)> = Default::default();
    let mut moved = vec![false; d.transfers.len()];
    let mut half_at: Vec<[(u32, u32); 2]> = vec![[(0, 0); 2]; d.transfers.len()];
    for (gi, g) in d.groups.iter().enumerate() {
        for h in &g.halves {
            half_at[h.transfer as usize][usize::from(!h.send)] = (gi as u32, h.device);
        }
    }
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let total_units: usize = queues.iter().map(VecDeque::len).sum();
    let mut finished = 0usize;
    while finished < total_units {
        // Candidate moves: start a unit at a queue's head, move a transfer, finish a group unit.
        #[derive(Clone, Copy)]
        enum Move {
            Start(usize),
            Transfer(u32),
            Finish(usize),
        }
        let mut moves = Vec::new();
        for (q, queue) in queues.iter().enumerate() {
            match queue.front() {
                Some(Unit::Op(o)) if op_waits.get(o).is_none_or(|w| w.iter().all(|p| done.contains(p))) => {
                    moves.push(Move::Start(q));
                }
                Some(Unit::Op(_)) => {}
                Some(Unit::G(g, dev)) => {
                    if started.contains(&(*g, *dev)) {
                        let all = d.groups[*g as usize]
                            .halves
                            .iter()
                            .filter(|h| h.device == *dev)
                            .all(|h| moved[h.transfer as usize]);
                        if all {
                            moves.push(Move::Finish(q));
                        }
                    } else {
                        let ready = d.groups[*g as usize]
                            .halves
                            .iter()
                            .filter(|h| h.device == *dev)
                            .all(|h| h.waits.iter().all(|p| done.contains(p)));
                        if ready {
                            moves.push(Move::Start(q));
                        }
                    }
                }
                None => {}
            }
        }
        for (t, m) in moved.iter().enumerate() {
            if !m && half_at[t].iter().all(|u| started.contains(u)) {
                moves.push(Move::Transfer(t as u32));
            }
        }
        if moves.is_empty() {
            let heads: Vec<String> =
                queues.iter().filter_map(|q| q.front()).map(|u| format!("{u:?}")).collect();
            return Err(ExecError::Buffers(format!(
                "the split plan deadlocks: nothing can move; waiting at {}",
                heads.join(", ")
            )));
        }
        match moves[rng.random_range(0..moves.len())] {
            Move::Start(q) => match queues[q].front().copied() {
                Some(Unit::Op(o)) => {
                    run_host_op(plan, &mut mem, &plan.ops[o as usize].action)?;
                    done.insert(Point::Op(o));
                    queues[q].pop_front();
                    finished += 1;
                }
                Some(Unit::G(g, dev)) => {
                    started.insert((g, dev));
                }
                None => {}
            },
            Move::Transfer(t) => {
                let tr = &d.transfers[t as usize];
                super::plan::host_copy(plan, &mut mem, &tr.src, &tr.dst)?;
                moved[t as usize] = true;
            }
            Move::Finish(q) => {
                if let Some(Unit::G(g, dev)) = queues[q].pop_front() {
                    done.insert(Point::Group { group: g, device: dev });
                    finished += 1;
                }
            }
        }
    }
    Ok(host_results(plan, mem, &shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_give_each_process_consecutive_devices() {
        assert_eq!(blocks(6, 3), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(blocks(3, 1), vec![0, 1, 2]);
    }
}
