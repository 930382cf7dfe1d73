//! The TCP rendezvous of a multi-node run, on `std::net` alone: rank 0 listens, every other
//! rank connects (retrying until a deadline, since launchers start processes in any order)
//! and says who it is and the hash of the arguments it was launched with; once all have
//! joined, rank 0 answers each with the world size, the hash and a blob (the NCCL unique id
//! of the first communicator). The same sockets then carry broadcasts from rank 0 (further
//! unique ids), gathers to rank 0 (each rank's timing and check result) and barriers.
//!
//! A rank launched with different arguments, a world size that disagrees, a duplicate rank
//! or a rank that never comes are errors on rank 0, which tells every joined rank why
//! before giving up, so that no process waits forever. GPU-free: always built and tested.
//!
//! Wire format (all integers little-endian): a hello is `FSRZ`, version, rank, world (u32
//! each) and the hash (u64); every later message is a frame: a tag byte (0 data, 1 error)
//! and a u32 length before its bytes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

const MAGIC: &[u8; 4] = b"FSRZ";
const VERSION: u32 = 1;
/// Largest frame accepted (a guard against a stray connection's garbage).
const MAX_FRAME: u32 = 64 << 20;

/// How long to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// For every rank to join (rank 0), or to reach rank 0 (the others).
    pub join: Duration,
    /// For any one later message (a gather waits for the slowest rank's run).
    pub io: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { join: Duration::from_secs(120), io: Duration::from_secs(600) }
    }
}

/// Why the rendezvous failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    /// The address does not resolve or cannot be bound.
    #[error("rendezvous address {addr}: {msg}")]
    Address {
        /// The address.
        addr: String,
        /// What went wrong.
        msg: String,
    },
    /// Nobody answered in time.
    #[error("{0}")]
    Timeout(String),
    /// Ranks disagree about the run.
    #[error("{0}")]
    Mismatch(String),
    /// Rank 0 gave up and said why.
    #[error("rank 0 aborted the run: {0}")]
    Aborted(String),
    /// A socket failed or carried something unexpected.
    #[error("{0}")]
    Io(String),
}

type Result<T> = std::result::Result<T, RendezvousError>;

/// Rank 0's listening socket, before anyone has joined.
pub struct Listener {
    inner: TcpListener,
}

impl Listener {
    /// Binds rank 0's socket on every interface at `addr`'s port (`host:0` picks a free
    /// port; see [`Listener::port`]).
    pub fn bind(addr: &str) -> Result<Listener> {
        let port = addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).ok_or_else(|| {
            RendezvousError::Address { addr: addr.into(), msg: "expected HOST:PORT".into() }
        })?;
        let inner = TcpListener::bind(("0.0.0.0", port)).map_err(|e| RendezvousError::Address {
            addr: addr.into(),
            msg: format!(
                "rank 0 cannot listen on port {port} ({e}); pick a free port with --rendezvous or MASTER_PORT"
            ),
        })?;
        Ok(Listener { inner })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.inner.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    /// Waits for ranks `1..world` to join with `hash`, then sends each the header and `blob`.
    pub fn accept_all(self, world: u32, hash: u64, blob: &[u8], t: Timeouts) -> Result<Rendezvous> {
        let mut peers: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        let mut joined = 0usize;
        let mut others: Vec<TcpStream> = Vec::new();
        let nb = |e: std::io::Error| RendezvousError::Io(format!("rendezvous socket: {e}"));
        self.inner.set_nonblocking(true).map_err(nb)?;
        let deadline = Deadline::after(t.join);
        let fail = |peers: &mut Vec<Option<TcpStream>>, others: &mut Vec<TcpStream>, e: RendezvousError| {
            let msg = e.to_string();
            for s in peers.iter_mut().flatten().chain(others.iter_mut()) {
                let _ = write_frame(s, 1, msg.as_bytes());
            }
            e
        };
        while joined + 1 < world as usize {
            match self.inner.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false).map_err(nb)?;
                    s.set_read_timeout(Some(t.io.min(Duration::from_secs(10)))).map_err(nb)?;
                    let _ = s.set_nodelay(true);
                    let hello = match read_hello(&mut s) {
                        Ok(h) => h,
                        // Not one of ours (a port scanner, a stale client): ignore it.
                        Err(_) => continue,
                    };
                    let (r, w, h) = hello;
                    let err = if w != world {
                        Some(RendezvousError::Mismatch(format!(
                            "rank {r} (from {from}) was launched with a world of {w} processes, rank 0 with {world}: \
                             every process must see the same world size"
                        )))
                    } else if h != hash {
                        Some(RendezvousError::Mismatch(format!(
                            "rank {r} (from {from}) was launched with different arguments (configuration hash \
                             {h:016x}, rank 0's is {hash:016x}): launch every process with the same command line \
                             and files"
                        )))
                    } else if r == 0 || r >= world {
                        Some(RendezvousError::Mismatch(format!(
                            "a process (from {from}) says it is rank {r}; valid ranks besides rank 0 are 1..{}",
                            world - 1
                        )))
                    } else if peers[r as usize - 1].is_some() {
                        Some(RendezvousError::Mismatch(format!(
                            "two processes say they are rank {r} (the second from {from}): check the launcher's rank \
                             variables"
                        )))
                    } else {
                        None
                    };
                    if let Some(e) = err {
                        others.push(s);
                        return Err(fail(&mut peers, &mut others, e));
                    }
                    s.set_read_timeout(Some(t.io)).map_err(nb)?;
                    peers[r as usize - 1] = Some(s);
                    joined += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if deadline.passed() {
                        let missing: Vec<String> = peers
                            .iter()
                            .enumerate()
                            .filter(|(_, p)| p.is_none())
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        let e = RendezvousError::Timeout(format!(
                            "only {joined} of the {} other ranks joined rank 0's rendezvous on port {} within {} s; \
                             missing ranks: {}: did they start, and can they reach this host's port?",
                            world - 1,
                            self.port(),
                            t.join.as_secs_f64(),
                            missing.join(", ")
                        ));
                        return Err(fail(&mut peers, &mut others, e));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(fail(&mut peers, &mut others, nb(e))),
            }
        }
        let mut peers: Vec<TcpStream> = peers.into_iter().flatten().collect();
        let mut head = Vec::with_capacity(12 + blob.len());
        head.extend_from_slice(&world.to_le_bytes());
        head.extend_from_slice(&hash.to_le_bytes());
        head.extend_from_slice(blob);
        for s in &mut peers {
            write_frame(s, 0, &head)?;
        }
        Ok(Rendezvous { rank: 0, world, peers, up: None, blob: blob.to_vec() })
    }
}

/// A joined rendezvous: rank 0 holds one socket per other rank, the others one to rank 0.
pub struct Rendezvous {
    rank: u32,
    world: u32,
    peers: Vec<TcpStream>,
    up: Option<TcpStream>,
    blob: Vec<u8>,
}

impl Rendezvous {
    /// Rank 0 binds `addr`'s port and waits; every other rank connects to `addr`.
    pub fn join(
        rank: u32,
        world: u32,
        addr: &str,
        hash: u64,
        blob: &[u8],
        t: Timeouts,
    ) -> Result<Rendezvous> {
        if rank == 0 {
            if world == 1 {
                return Ok(Rendezvous { rank, world, peers: Vec::new(), up: None, blob: blob.to_vec() });
            }
            Listener::bind(addr)?.accept_all(world, hash, blob, t)
        } else {
            Rendezvous::connect(addr, rank, world, hash, t)
        }
    }

    /// Connects rank `rank` to rank 0 at `addr`, retrying until `t.join` has passed.
    pub fn connect(addr: &str, rank: u32, world: u32, hash: u64, t: Timeouts) -> Result<Rendezvous> {
        let deadline = Deadline::after(t.join);
        let mut last;
        let mut s = loop {
            match resolve(addr) {
                Ok(a) => match TcpStream::connect_timeout(&a, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(e) => last = e.to_string(),
                },
                Err(e) => last = e,
            }
            if deadline.passed() {
                return Err(RendezvousError::Timeout(format!(
                    "rank {rank} could not reach rank 0's rendezvous at {addr} within {} s (last error: {last}): is \
                     rank 0 running, and is {addr} its host and a port this node can reach?",
                    t.join.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let io = |e: std::io::Error| RendezvousError::Io(format!("rank {rank}'s rendezvous socket: {e}"));
        let _ = s.set_nodelay(true);
        let mut hello = Vec::with_capacity(24);
        hello.extend_from_slice(MAGIC);
        for x in [VERSION, rank, world] {
            hello.extend_from_slice(&x.to_le_bytes());
        }
        hello.extend_from_slice(&hash.to_le_bytes());
        s.write_all(&hello).map_err(io)?;
        // Rank 0 answers once the last rank has joined.
        s.set_read_timeout(Some(t.join + Duration::from_secs(5))).map_err(io)?;
        let head = read_frame(&mut s, "rank 0's welcome")?;
        if head.len() < 12 {
            return Err(RendezvousError::Io("rank 0's welcome is truncated".into()));
        }
        let w = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let h = u64::from_le_bytes(head[4..12].try_into().unwrap_or([0; 8]));
        if w != world || h != hash {
            return Err(RendezvousError::Mismatch(format!(
                "rank 0 runs a world of {w} with configuration hash {h:016x}; this rank {world} and {hash:016x}"
            )));
        }
        s.set_read_timeout(Some(t.io)).map_err(io)?;
        Ok(Rendezvous { rank, world, peers: Vec::new(), up: Some(s), blob: head[12..].to_vec() })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Processes in all.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// The blob rank 0 published when everyone had joined.
    pub fn blob(&self) -> &[u8] {
        &self.blob
    }

    /// Rank 0 sends `data` to every rank; every rank returns it (the others ignore `data`).
    pub fn broadcast(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        if let Some(up) = &mut self.up {
            return read_frame(up, "a broadcast from rank 0");
        }
        for s in &mut self.peers {
            write_frame(s, 0, data)?;
        }
        Ok(data.to_vec())
    }

    /// Every rank sends `mine` to rank 0, which returns all of them in rank order; the
    /// others return `None`.
    pub fn gather(&mut self, mine: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        if let Some(up) = &mut self.up {
            write_frame(up, 0, mine)?;
            return Ok(None);
        }
        let mut all = vec![mine.to_vec()];
        for (i, s) in self.peers.iter_mut().enumerate() {
            all.push(read_frame(s, &format!("rank {}'s result", i + 1))?);
        }
        Ok(Some(all))
    }

    /// Returns on every rank once every rank has called it.
    pub fn barrier(&mut self) -> Result<()> {
        self.gather(&[])?;
        self.broadcast(&[])?;
        Ok(())
    }

    /// Rank 0 tells every rank that the run failed and why (the others do nothing).
    pub fn abort(&mut self, why: &str) {
        for s in &mut self.peers {
            let _ = write_frame(s, 1, why.as_bytes());
        }
    }
}

/// A deadline on the monotonic clock (a network wait's timeout; never a simulated time).
struct Deadline(std::time::Instant);

impl Deadline {
    fn after(d: Duration) -> Deadline {
        #[allow(clippy::disallowed_methods)]
        let now = std::time::Instant::now();
        Deadline(now + d)
    }
    fn passed(&self) -> bool {
        #[allow(clippy::disallowed_methods)]
        let now = std::time::Instant::now();
        now >= self.0
    }
}

fn resolve(addr: &str) -> std::result::Result<SocketAddr, String> {
    let mut it = addr.to_socket_addrs().map_err(|e| format!("cannot resolve {addr}: {e}"))?;
    it.next().ok_or_else(|| format!("{addr} resolves to no address"))
}

fn read_hello(s: &mut TcpStream) -> std::io::Result<(u32, u32, u64)> {
    let mut b = [0u8; 24];
    s.read_exact(&mut b)?;
    let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if &b[..4] != MAGIC || u(4) != VERSION {
        return Err(std::io::Error::other("not a fabricsim rendezvous hello"));
    }
    let mut h = [0u8; 8];
    h.copy_from_slice(&b[16..24]);
    Ok((u(8), u(12), u64::from_le_bytes(h)))
}

fn write_frame(s: &mut TcpStream, tag: u8, data: &[u8]) -> Result<()> {
    let mut b = Vec::with_capacity(5 + data.len());
    b.push(tag);
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).map_err(|e| RendezvousError::Io(format!("sending on the rendezvous socket: {e}")))
}

fn read_frame(s: &mut TcpStream, what: &str) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| {
        let why = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "timed out".to_string(),
            std::io::ErrorKind::UnexpectedEof => "the peer closed the connection (did it fail?)".to_string(),
            _ => e.to_string(),
        };
        RendezvousError::Io(format!("waiting for {what}: {why}"))
    };
    let mut h = [0u8; 5];
    s.read_exact(&mut h).map_err(io)?;
    let len = u32::from_le_bytes([h[1], h[2], h[3], h[4]]);
    if len > MAX_FRAME {
        return Err(RendezvousError::Io(format!(
            "{what}: a frame of {len} bytes is not a fabricsim message"
        )));
    }
    let mut b = vec![0u8; len as usize];
    s.read_exact(&mut b).map_err(io)?;
    match h[0] {
        0 => Ok(b),
        1 => Err(RendezvousError::Aborted(String::from_utf8_lossy(&b).into_owned())),
        t => Err(RendezvousError::Io(format!("{what}: unknown frame tag {t}"))),
    }
}

/// FNV-1a, 64 bits: the configuration hash every rank sends (stable across builds and
/// machines, unlike std's hasher).
pub fn config_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain((p.len() as u64).to_le_bytes().iter()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_stable_and_separates_fields() {
        assert_eq!(config_hash(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(config_hash(&[b"ab", b"c"]), config_hash(&[b"a", b"bc"]));
        assert_eq!(config_hash(&[b"x"]), config_hash(&[b"x"]));
    }

    #[test]
    fn a_bad_address_is_named() {
        let e = Listener::bind("host").err().unwrap();
        assert_eq!(e.to_string(), "rendezvous address host: expected HOST:PORT");
    }
}
