//! Model-based property test: `BoundedQueue` against a `VecDeque` of the same capacity.
//!
//! Runs 256 cases by default (4 under miri); set `PROPTEST_CASES` to run more or fewer.

use std::collections::VecDeque;

use kvgate::queue::BoundedQueue;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
enum Op {
    Push,
    ForcePush,
    Pop,
    Len,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![Just(Op::Push), Just(Op::ForcePush), Just(Op::Pop), Just(Op::Len)]
}

fn max_ops() -> usize {
    if cfg!(miri) { 40 } else { 300 }
}

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn behaves_like_vecdeque(
        cap in prop_oneof![Just(1usize), Just(2), 1usize..=9, 10usize..=40],
        ops in prop::collection::vec(op(), 0..max_ops()),
    ) {
        let q = BoundedQueue::new(cap);
        let mut model = VecDeque::with_capacity(cap);
        for (id, op) in ops.into_iter().enumerate() {
            match op {
                Op::Push => {
                    let expected = if model.len() < cap {
                        model.push_back(id);
                        Ok(())
                    } else {
                        Err(id)
                    };
                    prop_assert_eq!(q.push(id), expected);
                }
                Op::ForcePush => {
                    let displaced = if model.len() == cap { model.pop_front() } else { None };
                    model.push_back(id);
                    prop_assert_eq!(q.force_push(id), displaced);
                }
                Op::Pop => prop_assert_eq!(q.pop(), model.pop_front()),
                Op::Len => {}
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert_eq!(q.is_empty(), model.is_empty());
            prop_assert_eq!(q.is_full(), model.len() == cap);
            prop_assert_eq!(q.capacity(), cap);
        }
        let rest: Vec<_> = q.into_iter().collect();
        prop_assert_eq!(rest, Vec::from(model));
    }
}
