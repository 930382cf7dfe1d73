//! Scale-out network generators: rail-optimized fabrics with scalable units (NVIDIA
//! SuperPOD style) and plain fat trees, in one, two or three switch tiers, with a
//! configurable leaf oversubscription.
//!
//! Sizing rules (checked against the DGX SuperPOD reference architectures, HARDWARE_FACTS
//! §6.2-6.3): a leaf serves `nodes_per_su` nodes on one rail and has as many uplinks
//! divided by the oversubscription; spines take `leaves * uplinks / radix` switches,
//! rounded up to a divisor of the uplinks so that every leaf reaches every spine alike; when
//! the leaves outnumber a spine's ports (or the network's `two_tier_max_leaves`, 32 for
//! the DGX H100 SuperPOD) the fabric grows a core tier and leaves are grouped
//! into pods of `radix / 2 / rails` scalable units. For H100 (radix 64, 8 rails, 32 nodes
//! per SU) this gives 8/4, 16/8, 24/16, 32/16 leaf/spine switches for 1-4 SUs, and for B200 at
//! 16 SUs 128 leaves, 128 spines and 64 cores, as in the reference architectures.

use super::spec::{NetTopology, NetworkSpec, TopologySpec};
use super::*;
use crate::units::SimTime;

struct Net<'a> {
    devices: &'a mut Vec<Device>,
    links: &'a mut Vec<Link>,
    rate: Bandwidth,
    sw_lat: SimTime,
    cable: SimTime,
}

impl Net<'_> {
    fn switch(&mut self, name: String, tier: u8, spec: &NetworkSpec) -> DeviceId {
        let id = DeviceId(self.devices.len() as u32);
        self.devices.push(Device {
            name: DeviceName::Own(name),
            kind: DeviceKind::NetSwitch {
                tier,
                radix: spec.switch.radix,
                sharp: spec.switch.sharp.clone().map(Box::new),
            },
            node: None,
            model: Some(Arc::from(spec.switch.model.as_str())),
        });
        id
    }
    /// A full-duplex port between two devices; `a_lat` is the latency of a -> b.
    fn cable(&mut self, a: DeviceId, b: DeviceId, a_lat: SimTime, b_lat: SimTime) {
        self.cable_at(a, b, a_lat, b_lat, self.rate)
    }
    /// A full-duplex port at `rate` (a NIC's port runs at the NIC's rate when it is slower
    /// than the network's, as in an imported NCCL topology with NICs of several speeds).
    fn cable_at(&mut self, a: DeviceId, b: DeviceId, a_lat: SimTime, b_lat: SimTime, rate: Bandwidth) {
        for (s, t, lat) in [(a, b, a_lat), (b, a, b_lat)] {
            self.links.push(Link { src: s, dst: t, kind: LinkKind::Net, bw: rate, latency: lat, lanes: 1 });
        }
    }
}

/// Which leaf NIC `rail` of node `n` plugs into.
type LeafOf = Box<dyn Fn(u32, u32) -> u32>;

fn err(spec: &TopologySpec, msg: impl Into<String>) -> TopologyError {
    TopologyError::Invalid { file: spec.source.display().to_string(), msg: msg.into() }
}

/// Adds the network switches and ports; returns what was built.
pub(crate) fn build_network(
    spec: &TopologySpec,
    ns: &NetworkSpec,
    nodes: &[HostNode],
    devices: &mut Vec<Device>,
    links: &mut Vec<Link>,
    nic_lat: SimTime,
    nnodes: u32,
) -> Result<NetworkInfo, TopologyError> {
    let radix = ns.switch.radix;
    let rails = nodes[0].nics.len() as u32;
    let cable = SimTime::from_ns(50); // ~10 m at ~5 ns/m
    let mut net = Net { devices, links, rate: ns.rate, sw_lat: ns.switch.latency, cable };
    let sw_hop = net.sw_lat + net.cable;

    // Leaves and which leaf each NIC plugs into.
    let (_, up, nleaves, leaf_of): (u32, u32, u32, LeafOf) = match ns.topology {
        NetTopology::RailOptimized => {
            let s = ns.nodes_per_su;
            let up = (s as f64 / ns.oversubscription).ceil() as u32;
            if s as u64 + up as u64 > radix as u64 {
                return Err(err(
                    spec,
                    format!(
                        "rail-optimized leaves need {s} down + {up} up ports for nodes_per_su = {s} \
                         (oversubscription {}), more than the switch radix {radix}; use nodes_per_su <= {} \
                         or a higher oversubscription",
                        ns.oversubscription,
                        radix / 2
                    ),
                ));
            }
            let sus = nnodes.div_ceil(s);
            (s, up, sus * rails, Box::new(move |n, r| (n / s) * rails + r))
        }
        NetTopology::FatTree => {
            let o = ns.oversubscription;
            let down = ((radix as f64 * o / (1.0 + o)).round() as u32).clamp(1, radix - 1);
            let up = radix - down;
            let ports = nnodes * rails;
            (down, up, ports.div_ceil(down), Box::new(move |n, r| (n * rails + r) / down))
        }
    };
    let single = nleaves == 1;
    let tiers = match ns.tiers {
        Some(t) => t,
        None if single => 1,
        None if nleaves <= ns.two_tier_max_leaves.unwrap_or(radix).min(radix) => 2,
        None => 3,
    };
    let leaf_name = |i: u32| match ns.topology {
        NetTopology::RailOptimized => format!("leaf.su{}.r{}", i / rails, i % rails),
        NetTopology::FatTree => format!("leaf{i}"),
    };
    let leaves: Vec<DeviceId> = (0..nleaves).map(|i| net.switch(leaf_name(i), 0, ns)).collect();
    for (n, hn) in nodes.iter().enumerate() {
        for (r, &nic) in hn.nics.iter().enumerate() {
            let leaf = leaves[leaf_of(n as u32, r as u32) as usize];
            let rate = match net.devices[nic.idx()].kind {
                DeviceKind::Nic { rate, .. } => rate.min(net.rate),
                _ => net.rate,
            };
            net.cable_at(nic, leaf, nic_lat + net.cable, sw_hop, rate);
        }
    }
    match tiers {
        1 => {}
        2 => {
            if nleaves > radix {
                return Err(err(
                    spec,
                    format!(
                        "{nleaves} leaf switches do not fit a two-tier fabric of radix {radix}; \
                         use tiers = 3 (or leave tiers unset)"
                    ),
                ));
            }
            // The fewest spines whose ports hold every uplink, rounded up to a divisor of
            // the uplinks so that every leaf has the same number of cables to every spine
            // (the DGX H100 SuperPOD RA uses 16 spines for 3 SUs as for 4 [S11]).
            let need = (nleaves * up).div_ceil(radix).max(1).min(up);
            let nspines = (need..=up).find(|d| up % d == 0).unwrap_or(up);
            let spines: Vec<DeviceId> =
                (0..nspines).map(|j| net.switch(format!("spine{j}"), 1, ns)).collect();
            // Leaf i's k-th uplink goes to spine (i * up + k) mod spines: every spine gets
            // the same number of downlinks even when `up` is not a multiple of the spines.
            for (i, &leaf) in leaves.iter().enumerate() {
                for k in 0..up {
                    let j = (i as u32 * up + k) % nspines;
                    net.cable(leaf, spines[j as usize], sw_hop, sw_hop);
                }
            }
        }
        _ => {
            let half = radix / 2;
            let leaves_per_pod = match ns.topology {
                NetTopology::RailOptimized => {
                    if rails > half {
                        return Err(err(
                            spec,
                            format!("{rails} rails do not fit pods of switches with radix {radix}"),
                        ));
                    }
                    (half / rails).max(1) * rails
                }
                NetTopology::FatTree => half,
            };
            let pods = nleaves.div_ceil(leaves_per_pod);
            let spines_per_pod = (leaves_per_pod * up).div_ceil(half).max(1).min(up);
            let groups = (pods * half).div_ceil(radix).max(1);
            let cores: Vec<Vec<DeviceId>> = (0..spines_per_pod)
                .map(|j| (0..groups).map(|g| net.switch(format!("core{j}.{g}"), 2, ns)).collect())
                .collect();
            for p in 0..pods {
                let spines: Vec<DeviceId> =
                    (0..spines_per_pod).map(|j| net.switch(format!("pod{p}.spine{j}"), 1, ns)).collect();
                let l0 = p * leaves_per_pod;
                let l1 = (l0 + leaves_per_pod).min(nleaves);
                for (i, &leaf) in leaves[l0 as usize..l1 as usize].iter().enumerate() {
                    for k in 0..up {
                        let j = (i as u32 * up + k) % spines_per_pod;
                        net.cable(leaf, spines[j as usize], sw_hop, sw_hop);
                    }
                }
                for (j, &sp) in spines.iter().enumerate() {
                    for m in 0..half {
                        net.cable(sp, cores[j][(m % groups) as usize], sw_hop, sw_hop);
                    }
                }
            }
        }
    }
    Ok(NetworkInfo {
        topology: ns.topology.key().to_string(),
        tiers,
        port_rate: ns.rate,
        oversubscription: ns.oversubscription,
        nodes_per_su: ns.nodes_per_su,
        switch_model: ns.switch.model.clone(),
        sharp: ns.switch.sharp.is_some(),
        routing: ns.routing,
    })
}
