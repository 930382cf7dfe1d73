//! The event queue: a radix heap (a monotone priority queue: no event is ever scheduled
//! before the current time) of `(time, sequence) -> payload`. The sequence number makes the
//! order total, so equal-time events pop in insertion order and a run is deterministic.
//! Nothing here allocates once the buckets have grown to their working size.

use std::cmp::Reverse;

use radix_heap::RadixHeapMap;

use crate::units::SimTime;

/// A deterministic priority queue of events carrying a `u64` payload.
#[derive(Default)]
pub struct EventQueue {
    heap: RadixHeapMap<Reverse<u128>, u64>,
    seq: u64,
}

impl EventQueue {
    /// An empty queue.
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Schedules `payload` at `at`.
    #[inline]
    pub fn push(&mut self, at: SimTime, payload: u64) {
        self.heap.push(Reverse(((at.0 as u128) << 64) | self.seq as u128), payload);
        self.seq += 1;
    }

    /// Removes the earliest event.
    #[inline]
    pub fn pop(&mut self) -> Option<(SimTime, u64)> {
        self.heap.pop().map(|(Reverse(k), p)| (SimTime((k >> 64) as u64), p))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<SimTime> {
        // Not on the hot path: the radix heap keeps its minimum only loosely ordered.
        self.heap.keys().map(|Reverse(k)| *k).min().map(|k| SimTime((k >> 64) as u64))
    }

    /// Pending events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No pending events.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|(_, p)| p)).collect();
        assert_eq!(order, vec![2, 4, 1, 3]);
    }
}
