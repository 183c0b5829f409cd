//! Engine metrics from an untrusted `/metrics` body: the Prometheus text parser and the KV budget
//! corrector behind it. Any bytes (lossily decoded, as an HTTP body is) must parse or fail with an error,
//! never panic; every sample's labels can be read; and a correction made from whatever parsed keeps the
//! budget within its bounds, and the admission usable.
#![no_main]

use kvgate::feedback::{EngineFeedback, EngineMetrics, FeedbackConfig, Quantity, samples};
use kvgate::{Admission, Request};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for sample in samples(&text).flatten() {
        for key in ["engine", "tp_rank", "model_name", "le"] {
            let _ = sample.label(key);
        }
    }
    let Ok(metrics) = EngineMetrics::parse(&text) else { return };
    for quantity in Quantity::ALL {
        if let Some(value) = metrics.get(quantity) {
            assert!(value.is_finite(), "{quantity:?} = {value}");
        }
    }
    let admission = Admission::builder().kv_capacity_tokens(100_000).queue_capacity(0).build().unwrap();
    let held: Vec<_> = (0..8).map(|_| admission.try_admit(&Request::new(1000, 9000)).unwrap()).collect();
    let mut feedback = EngineFeedback::new(admission.clone(), FeedbackConfig::new()).unwrap();
    let (min, max) = feedback.bounds();
    for second in 0..3 {
        let correction = feedback.update(Duration::from_secs(second * 5), &metrics);
        assert!((min..=max).contains(&correction.to), "{correction:?}");
        assert_eq!(admission.snapshot().kv_capacity, correction.to);
    }
    drop(held);
    assert_eq!(admission.snapshot().kv_used, 0);
});
