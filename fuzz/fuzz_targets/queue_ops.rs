//! `BoundedQueue` against a `VecDeque` of the same capacity: arbitrary push / force_push / pop sequences,
//! with drop counting (every item dropped exactly once, including those left in the queue when it drops).
#![no_main]

use kvgate::queue::BoundedQueue;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

#[derive(Debug, Arbitrary)]
enum Op {
    Push,
    ForcePush,
    Pop,
    /// Pop up to this many items.
    Drain(u8),
}

#[derive(Debug, Arbitrary)]
struct Input {
    /// Capacity 1..=64 (0 panics by contract; covered by tests/bad_inputs.rs).
    cap: u8,
    /// Drop the queue with its items still inside at the end, instead of draining it.
    drop_full: bool,
    ops: Vec<Op>,
}

/// An item that records its drop, to prove every item is dropped exactly once.
#[derive(Debug)]
struct Item {
    id: usize,
    drops: Rc<RefCell<Vec<u32>>>,
}

impl Drop for Item {
    fn drop(&mut self) {
        self.drops.borrow_mut()[self.id] += 1;
    }
}

fuzz_target!(|input: Input| {
    let cap = usize::from(input.cap % 64) + 1;
    let drops = Rc::new(RefCell::new(vec![0u32; input.ops.len()]));
    let item = |id| Item { id, drops: Rc::clone(&drops) };
    let queue = BoundedQueue::new(cap);
    let mut model: VecDeque<usize> = VecDeque::with_capacity(cap);
    let mut created = 0;
    for (id, op) in input.ops.iter().enumerate() {
        match op {
            Op::Push => {
                created += 1;
                match queue.push(item(id)) {
                    Ok(()) => {
                        assert!(model.len() < cap, "push succeeded on a full queue");
                        model.push_back(id);
                    }
                    Err(back) => {
                        assert_eq!(model.len(), cap, "push refused on a queue with room");
                        assert_eq!(back.id, id, "push returned another item");
                    }
                }
            }
            Op::ForcePush => {
                created += 1;
                let displaced = queue.force_push(item(id)).map(|i| i.id);
                let expected = if model.len() == cap { model.pop_front() } else { None };
                model.push_back(id);
                assert_eq!(displaced, expected);
            }
            Op::Pop => assert_eq!(queue.pop().map(|i| i.id), model.pop_front()),
            Op::Drain(n) => {
                for _ in 0..*n {
                    assert_eq!(queue.pop().map(|i| i.id), model.pop_front());
                }
            }
        }
        assert_eq!(queue.len(), model.len());
        assert_eq!(queue.is_empty(), model.is_empty());
        assert_eq!(queue.is_full(), model.len() == cap);
        assert_eq!(queue.capacity(), cap);
    }
    if input.drop_full {
        drop(queue);
    } else {
        let rest: Vec<usize> = queue.into_iter().map(|i| i.id).collect();
        assert_eq!(rest, Vec::from(model));
    }
    let drops = drops.borrow();
    let created_ids = input.ops.iter().enumerate().filter(|(_, op)| matches!(op, Op::Push | Op::ForcePush));
    for (id, _) in created_ids {
        assert_eq!(drops[id], 1, "item {id} dropped {} times", drops[id]);
    }
    assert_eq!(drops.iter().map(|&d| d as usize).sum::<usize>(), created);
});
