//! The reservation policy: full reservations by default, a learned output estimate on request.
#![cfg(not(loom))]

use kvgate::{Admission, ConfigError, Request, Reservation};

#[test]
fn full_reservation_is_the_default() {
    let admission = Admission::builder().kv_capacity_tokens(10_000).build().unwrap();
    for _ in 0..100 {
        admission.try_admit(&Request::new(100, 1_000)).unwrap().complete(10);
    }
    assert_eq!(admission.output_estimate(), 1.0);
    assert_eq!(admission.try_admit(&Request::new(100, 1_000)).unwrap().kv_reserved(), 1_100);
}

#[test]
fn learned_reservation_follows_real_outputs_within_bounds() {
    let admission = Admission::builder()
        .kv_capacity_tokens(100_000)
        .reservation(Reservation::Learned { initial: 1.0, floor: 0.1, headroom: 1.25 })
        .build()
        .unwrap();
    assert_eq!(admission.output_estimate(), 1.0, "starts safe");
    // Outputs use 20% of max_new: the estimate converges to 0.2 x 1.25 = 0.25.
    for _ in 0..200 {
        admission.try_admit(&Request::new(0, 1_000)).unwrap().complete(200);
    }
    let estimate = admission.output_estimate();
    assert!((estimate - 0.25).abs() < 0.01, "{estimate}");
    let permit = admission.try_admit(&Request::new(500, 1_000)).unwrap();
    assert_eq!(permit.kv_reserved(), 500 + (1_000.0 * estimate).ceil() as u64);
    drop(permit);
    // Outputs of nothing: the estimate stops at the floor.
    for _ in 0..400 {
        admission.try_admit(&Request::new(1, 1_000)).unwrap().complete(0);
    }
    assert!((admission.output_estimate() - 0.1).abs() < 1e-9);
    // Longer outputs raise it again, never above 1.
    for _ in 0..400 {
        admission.try_admit(&Request::new(1, 1_000)).unwrap().complete(5_000);
    }
    assert_eq!(admission.output_estimate(), 1.0);
    assert_eq!(admission.snapshot().kv_used, 0);
}

#[test]
fn more_users_fit_with_a_learned_estimate() {
    let full = Admission::builder().kv_capacity_tokens(40_000).build().unwrap();
    let learned = Admission::builder().kv_capacity_tokens(40_000).reservation(Reservation::learned()).build().unwrap();
    for admission in [&full, &learned] {
        for _ in 0..100 {
            admission.try_admit(&Request::new(1_000, 4_000)).unwrap().complete(300);
        }
    }
    let count = |a: &Admission| {
        let held: Vec<_> = std::iter::from_fn(|| a.try_admit(&Request::new(1_000, 4_000)).ok()).take(1_000).collect();
        held.len()
    };
    let (n_full, n_learned) = (count(&full), count(&learned));
    assert_eq!(n_full, 8);
    assert!(n_learned >= 3 * n_full, "{n_learned} vs {n_full}");
}

#[test]
fn invalid_learned_settings_are_errors() {
    for policy in [
        Reservation::Learned { initial: 0.0, floor: 0.1, headroom: 1.0 },
        Reservation::Learned { initial: 1.0, floor: 1.5, headroom: 1.0 },
        Reservation::Learned { initial: 1.0, floor: 0.1, headroom: 0.5 },
        Reservation::Learned { initial: f64::NAN, floor: 0.1, headroom: 1.0 },
        Reservation::Learned { initial: 1.0, floor: 0.1, headroom: f64::INFINITY },
    ] {
        assert!(
            matches!(Admission::builder().reservation(policy).build(), Err(ConfigError::OutOfRange { .. })),
            "{policy:?}"
        );
    }
}
