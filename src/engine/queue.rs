//! The event queue: a monotone radix heap (no event is ever scheduled before the current
//! time) of `time -> payload`. Equal-time events pop in insertion order, so a run is
//! deterministic and symmetric streams that finish at the same time take turns. Nothing
//! here allocates once the buckets have grown to their working size.
//!
//! Bucket `b > 0` holds the events whose time first differs from the last popped time in
//! bit `b - 1`; bucket 0 holds those at that time, read front to back. Events of one time
//! are always in one bucket, in insertion order (a bucket is redistributed in order), so
//! the order is exactly `(time, insertion)`. A bit mask of the non-empty buckets finds the
//! next one in one instruction. Until 2026-12-02 the queue was the `radix-heap` crate keyed
//! on `(time, sequence)` as a `u128`: on the 1,024-GPU NVLS-Tree all-reduce that was 40% of
//! all instructions; this one keys on the time alone and gives the same order.

use crate::units::SimTime;

/// A deterministic priority queue of events carrying a `u64` payload.
pub struct EventQueue {
    /// Time of the last refill: no pushed event is earlier.
    last: u64,
    buckets: [Vec<(u64, u64)>; 65],
    /// Next unread entry of bucket 0.
    head: usize,
    /// Bit `b` set: bucket `b` may be non-empty (bucket 0: has unread entries).
    full: u128,
    len: usize,
    seq: u64,
}

impl Default for EventQueue {
    fn default() -> EventQueue {
        EventQueue { last: 0, buckets: std::array::from_fn(|_| Vec::new()), head: 0, full: 0, len: 0, seq: 0 }
    }
}

impl EventQueue {
    /// An empty queue.
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    #[inline]
    fn bucket(&self, t: u64) -> usize {
        (64 - (t ^ self.last).leading_zeros()) as usize
    }

    /// Schedules `payload` at `at` (not before the last popped time: the queue is monotone).
    #[inline]
    pub fn push(&mut self, at: SimTime, payload: u64) {
        debug_assert!(at.0 >= self.last, "event at {} before the current time {}", at.0, self.last);
        let t = at.0.max(self.last);
        let b = self.bucket(t);
        self.buckets[b].push((t, payload));
        self.full |= 1 << b;
        self.len += 1;
        self.seq += 1;
    }

    /// Removes the earliest event (of equal times, the first pushed).
    #[inline]
    pub fn pop(&mut self) -> Option<(SimTime, u64)> {
        if self.head == self.buckets[0].len() {
            self.buckets[0].clear();
            self.head = 0;
            self.full &= !1;
            self.refill()?;
        }
        let (t, p) = self.buckets[0][self.head];
        self.head += 1;
        self.len -= 1;
        Some((SimTime(t), p))
    }

    /// Makes the earliest non-empty bucket current (bucket 0 is empty): its minimum becomes
    /// the last time and its events move down, in order.
    fn refill(&mut self) -> Option<()> {
        if self.full == 0 {
            return None;
        }
        let b = self.full.trailing_zeros() as usize;
        let mut moving = std::mem::take(&mut self.buckets[b]);
        self.full &= !(1 << b);
        self.last = moving.iter().map(|e| e.0).min().unwrap_or(self.last);
        for &(t, p) in &moving {
            let nb = self.bucket(t);
            self.buckets[nb].push((t, p));
            self.full |= 1 << nb;
        }
        // Every event moved below `b` (it shares bit `b - 1` with the new last time): hand
        // the allocation back for the next time this bucket fills.
        moving.clear();
        self.buckets[b] = moving;
        Some(())
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<SimTime> {
        if let Some(e) = self.buckets[0].get(self.head) {
            return Some(SimTime(e.0));
        }
        let above = self.full & !1;
        (above != 0).then(|| {
            let b = above.trailing_zeros() as usize;
            SimTime(self.buckets[b].iter().map(|e| e.0).min().unwrap_or(self.last))
        })
    }

    /// Pending events.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No pending events.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Events pushed so far.
    pub fn pushed(&self) -> u64 {
        self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_then_insertion_order() {
        let mut q = EventQueue::new();
        q.push(SimTime(5), 1);
        q.push(SimTime(3), 2);
        q.push(SimTime(5), 3);
        q.push(SimTime(3), 4);
        assert_eq!(q.pop(), Some((SimTime(3), 2)));
        q.push(SimTime(3), 5); // at the current time, after those already there
        q.push(SimTime(5), 6);
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|(_, p)| p)).collect();
        assert_eq!(order, vec![4, 5, 1, 3, 6]);
        assert!(q.is_empty());
    }

    #[test]
    fn matches_a_time_then_insertion_reference_under_interleaved_pushes_and_pops() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let mut q = EventQueue::new();
        let mut reference: Vec<(u64, u64)> = Vec::new();
        let mut now = 0u64;
        for i in 0..20_000u64 {
            if rng.random_range(0..3) > 0 || reference.is_empty() {
                // Mostly near the present, sometimes far ahead, sometimes exactly now.
                let dt = match rng.random_range(0..4) {
                    0 => 0,
                    1 => rng.random_range(0..1_000),
                    2 => rng.random_range(0..1_000_000),
                    _ => rng.random_range(0..1u64 << 50),
                };
                q.push(SimTime(now + dt), i);
                reference.push((now + dt, i));
            } else {
                let (t, p) = q.pop().expect("non-empty");
                reference.sort_unstable();
                assert_eq!((t.0, p), reference.remove(0));
                assert!(t.0 >= now);
                now = t.0;
            }
            assert_eq!(q.len(), reference.len());
            if let Some(&m) = reference.iter().min() {
                assert_eq!(q.peek_time(), Some(SimTime(m.0)));
            }
        }
    }
}
