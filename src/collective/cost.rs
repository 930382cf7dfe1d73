//! What the closed forms of the analytical mode are given: the cost of one message over a
//! routed connection class ([`Hop`], with its static link share already applied) and the
//! shape of routed trees ([`TreeShape`]). `exec::analytic` routes the connections and
//! computes the shares; each algorithm's module prices them in its `closed_form`, beside
//! the schedule builder it models.

/// Cost of sending one message over one connection class.
#[derive(Clone, Copy, Debug)]
pub struct Hop {
    /// Route latency (links plus one packet per link).
    pub lat: f64,
    /// Per-channel bandwidth in bytes per µs after static sharing.
    pub bw: f64,
    /// Protocol step latency, µs.
    pub step: f64,
    /// µs per byte a message spends beyond its transfer before the next hop can use it: the
    /// store stage of a network send (the GPU fills the connection's FIFO slot with the
    /// whole message before the proxy posts it), or, on a lockstep ring, the wait for the
    /// ring's network message; 0 where the sender writes straight into the receiver's
    /// buffer at its own pace.
    pub fill: f64,
}

impl Hop {
    /// Serialisation of `bytes` at the hop's rate, µs.
    pub fn t(&self, bytes: f64) -> f64 {
        bytes / self.bw
    }
    /// One message end to end: its store stage, then its transfer.
    pub fn msg(&self, bytes: f64) -> f64 {
        self.lat + self.step + self.t(bytes) + self.fill * bytes
    }
}

/// Wire bytes of `bytes` of payload at a protocol's payload efficiency.
pub fn wire(bytes: f64, payload: f64) -> f64 {
    (bytes / payload).ceil()
}

/// What the tree closed form needs of the routed trees (zero for other algorithms).
#[derive(Clone, Copy, Debug, Default)]
pub struct TreeShape {
    /// Two candidate longest leaf-to-root paths as (fixed µs, µs per byte) at the
    /// unshared per-connection rate: the one with the most fixed latency, the one with the
    /// most per-byte time.
    pub paths: [(f64, f64); 2],
    /// µs per byte of one connection's traffic on the most loaded link (connections on
    /// it / its bandwidth).
    pub per_byte: f64,
    /// Slowest connection's µs per byte.
    pub tau: f64,
    /// Largest fixed µs of one message (route latency plus protocol step).
    pub lat: f64,
}
