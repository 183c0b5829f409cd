//! The dispatcher: where requests wait, and who hands them the capacity that others return.
//!
//! - `room.rs` — the waiting room behind one mutex and the passes that grant waiters (its invariants);
//! - `fair.rs` — one priority class: flows per tenant, weighted round-robin, parking;
//! - `waiter.rs` — a waiter's state machine and the slab that stores waiters without an allocation each;
//! - `wake_list.rs` — wake-ups collected under the lock and run after it, panic-contained;
//! - `timer.rs` — deadlines: the heap and the `kvgate-timer` thread.
//!
//! The fast paths stay outside: `try_admit` and `Permit::drop` take and return capacity with
//! compare-and-swap on the capacity words (`capacity.rs`) and come here only when a `HELD_BACK` bit tells
//! them a waiter needs the capacity they returned.

mod fair;
mod room;
mod timer;
mod waiter;
mod wake_list;

pub(crate) use room::{Abandoned, ClockFn, Dispatcher, Enqueued, Held, NewWaiter, Outcome, Resources};
pub(crate) use timer::Timer;
pub(crate) use waiter::{Notify, WaiterKey};
