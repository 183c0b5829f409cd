//! One million distinct tenant ids through `try_admit`: the registry never tracks more than its maximum
//! and the process's resident memory stays flat. In its own test binary so that no other test's
//! allocations blur the measurement.
#![cfg(not(loom))]

use kvgate::{Admission, Request, TenantLimits};

/// Resident set size in bytes (Linux), or `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn a_million_invented_tenant_ids_do_not_grow_memory() {
    let ids: u64 = if cfg!(miri) { 1_000 } else { 1_000_000 };
    let max_tenants = 1_000;
    let admission = Admission::builder()
        .max_tenants(max_tenants)
        .tenant_defaults(TenantLimits::new().request_rate(10.0, 20).max_in_flight(4))
        .build()
        .unwrap();
    let mut baseline = None;
    for id in 0..ids {
        drop(admission.try_admit(&Request::new(100, 100).tenant(id)));
        if id == ids / 10 {
            baseline = resident_bytes();
        }
    }
    assert!(admission.tracked_tenants() <= max_tenants, "{}", admission.tracked_tenants());
    if let (Some(before), Some(after)) = (baseline, resident_bytes()) {
        // After the registry filled up (by 10% of the ids), 900,000 more ids must not add memory beyond
        // allocator noise: 8 MiB is far below the ~100+ MiB an unbounded map would need.
        let growth = after.saturating_sub(before);
        assert!(growth < 8 << 20, "resident memory grew by {} KiB", growth >> 10);
        println!("resident: {} KiB after 10% of the ids, {} KiB at the end", before >> 10, after >> 10);
    } else {
        println!("no /proc/self/statm: memory not measured, tracked count checked");
    }
    assert_eq!(admission.snapshot().in_flight, 0);
}
