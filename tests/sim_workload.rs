//! The workload generator's distributions: lengths, Poisson arrivals, the morning rush.
#![cfg(feature = "sim")]

use kvgate::retry::SplitMix64;
use kvgate::sim::{LengthDist, PoissonArrivals, Profile, Workload};
use std::time::Duration;

fn draws(dist: &LengthDist, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    let mut v: Vec<u32> = (0..n).map(|_| dist.sample(&mut rng)).collect();
    v.sort_unstable();
    v
}

#[test]
fn log_normal_lengths_have_their_median_tail_and_bounds() {
    let dist = LengthDist::log_normal(600.0, 1.0, 16, 12_000).unwrap();
    let v = draws(&dist, 100_000, 7);
    let median = f64::from(v[v.len() / 2]);
    assert!((median - 600.0).abs() / 600.0 < 0.03, "median {median}");
    // P(X > e^(ln 600 + 2.326)) = 1 %: the 99th percentile is about 600 x 10.24 = 6,140.
    let p99 = f64::from(v[v.len() * 99 / 100]);
    assert!((p99 - 6144.0).abs() / 6144.0 < 0.06, "p99 {p99}");
    assert!(*v.first().unwrap() >= 16 && *v.last().unwrap() <= 12_000);
    assert_eq!(*v.last().unwrap(), 12_000, "the clamp is reached (about 0.1 % of draws)");
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
    assert!((mean - dist.mean()).abs() / dist.mean() < 0.02, "sample mean {mean} vs {}", dist.mean());
}

#[test]
fn fixed_and_uniform_lengths() {
    assert!(draws(&LengthDist::Fixed(42), 100, 1).iter().all(|&x| x == 42));
    let v = draws(&LengthDist::Uniform { min: 10, max: 19 }, 100_000, 2);
    for value in 10..=19 {
        let count = v.iter().filter(|&&x| x == value).count();
        assert!((9_000..11_000).contains(&count), "{value}: {count}");
    }
    assert_eq!(LengthDist::Uniform { min: 10, max: 19 }.mean(), 14.5);
    assert_eq!(LengthDist::log_normal(100.0, 0.0, 1, 1000).unwrap().mean().round(), 100.0);
}

#[test]
fn poisson_arrivals_have_the_right_rate_and_exponential_gaps() {
    let arrivals: Vec<f64> = PoissonArrivals::new(20.0, Profile::Flat, 3)
        .unwrap()
        .take_while(|t| *t < Duration::from_secs(1000))
        .map(|t| t.as_secs_f64())
        .collect();
    // 20,000 expected, standard deviation 141.
    assert!((19_400..20_600).contains(&arrivals.len()), "{}", arrivals.len());
    let gaps: Vec<f64> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!((mean - 0.05).abs() < 0.002, "mean gap {mean}");
    // Exponential: P(gap > mean) = 1/e.
    let above = gaps.iter().filter(|&&g| g > 0.05).count() as f64 / gaps.len() as f64;
    assert!((above - (-1.0f64).exp()).abs() < 0.015, "{above}");
    // Counts per second are Poisson: variance close to the mean.
    let mut per_second = vec![0u32; 1000];
    for t in &arrivals {
        per_second[*t as usize] += 1;
    }
    let m = per_second.iter().map(|&c| f64::from(c)).sum::<f64>() / 1000.0;
    let var = per_second.iter().map(|&c| (f64::from(c) - m).powi(2)).sum::<f64>() / 999.0;
    assert!((var / m - 1.0).abs() < 0.15, "dispersion {}", var / m);
}

#[test]
fn the_morning_rush_peaks_where_it_says() {
    let rush = Profile::MorningRush { peak_at: Duration::from_secs(600), spread: Duration::from_secs(120), floor: 0.1 };
    let arrivals: Vec<f64> = PoissonArrivals::new(50.0, rush, 9)
        .unwrap()
        .take_while(|t| *t < Duration::from_secs(1200))
        .map(|t| t.as_secs_f64())
        .collect();
    let in_window = |a: f64, b: f64| arrivals.iter().filter(|&&t| t >= a && t < b).count() as f64;
    // One minute at the peak: 50/s. One minute at the edge (5 spreads away): about the floor, 5/s.
    let peak = in_window(570.0, 630.0) / 60.0;
    let edge = in_window(0.0, 60.0) / 60.0;
    assert!((peak - 50.0 * rush.level(Duration::from_secs(600))).abs() < 5.0, "peak {peak}");
    assert!((edge - 5.0).abs() < 2.0, "edge {edge}");
    // The expected total is the integral of the rate: 50 x (0.1 x 1200 + 0.9 x 120 x sqrt(2 pi)) = 19,535.
    let expected = 50.0 * (0.1 * 1200.0 + 0.9 * 120.0 * (2.0 * std::f64::consts::PI).sqrt());
    assert!((arrivals.len() as f64 - expected).abs() < 4.0 * expected.sqrt(), "{} vs {expected}", arrivals.len());
}

#[test]
fn default_chat_lengths_are_documented() {
    let workload = Workload::employees(10, Duration::from_secs(60), Duration::from_secs(30));
    let (prompt, output) = workload.mean_lengths();
    assert!((prompt - 990.0).abs() < 15.0, "{prompt}");
    assert!((output - 318.0).abs() < 10.0, "{output}");
    workload.validate().unwrap();
}
