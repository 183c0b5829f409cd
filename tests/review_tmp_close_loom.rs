//! Review probe (temporary): an observer that has seen the admission closed (`is_closed() == true`) and
//! then sees the request token unspent must never see a grant spend it afterwards.
#![cfg(loom)]

use kvgate::{Admission, Request};
use loom::thread;

#[test]
fn review_tmp_observer_that_saw_closed_never_sees_a_later_grant() {
    loom::model(|| {
        let a = Admission::builder()
            .max_in_flight(1)
            .request_rate(0.001, 1)
            .deadline_timer(false)
            .clock(kvgate::clock::ManualClock::new())
            .build()
            .unwrap();
        let racer = {
            let a = a.clone();
            thread::spawn(move || a.try_admit(&Request::new(1, 0)).map(drop))
        };
        let closer = {
            let a = a.clone();
            thread::spawn(move || a.close())
        };
        // The observer: closed, then the token still there.
        let seen = a.is_closed().then(|| a.rate_status(None).requests.unwrap().remaining);
        let raced = racer.join().unwrap();
        closer.join().unwrap();
        if seen == Some(1) {
            assert!(raced.is_err(), "observer saw closed and the token unspent, then the racer was granted on it");
        }
    });
}
