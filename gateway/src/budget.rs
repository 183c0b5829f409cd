//! Token budgets per tenant — a day's or a calendar month's prompt + output tokens (UTC) — and the
//! usage they are checked against, kept across restarts in a small state file.
//!
//! # How a request is charged
//!
//! Before admission, a request of a tenant with a budget *reserves* what it may use (its prompt
//! estimate + its output reservation): if the tenant's usage plus its running reservations plus this
//! one would pass a budget, the request gets `429 budget_exceeded` with the time the budget renews, and
//! holds nothing. When its answer ends, the reservation becomes usage: the prompt and the output tokens
//! counted in the answer (all of the reservation's output part when the count is unknown, the
//! conservative side). A request refused by admission, or whose answer never started, is charged
//! nothing. So concurrent requests cannot together spend past a budget.
//!
//! Usage is counted for every configured tenant, with or without a budget (for `/metrics` and the
//! admin endpoint). Periods roll over at midnight UTC and on the first of the month, UTC.
//!
//! # State file
//!
//! With a state file (`--state-file`), usage is written there (JSON, replaced atomically through a
//! temporary file and a rename) at most every two seconds when it changed, and on shutdown; it is read
//! at start. A file that cannot be read or parsed is an error at start (the gateway does not silently
//! forget what tenants spent). Each replica keeps its own file: budgets are per replica.

use kvgate::TenantId;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock budgets are reckoned by (injected so that tests can be on any day).
pub type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The system's wall clock.
pub fn system_clock() -> WallClock {
    Arc::new(SystemTime::now)
}

/// A budget period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Period {
    /// A day, UTC.
    Day,
    /// A calendar month, UTC.
    Month,
}

impl Period {
    /// `daily` or `monthly`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "daily",
            Period::Month => "monthly",
        }
    }
}

/// A refusal: the tenant's budget for `period` is spent (or this request would pass it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    /// The tenant.
    pub tenant: Arc<str>,
    /// Which budget.
    pub period: Period,
    /// Its size in tokens.
    pub limit: u64,
    /// Tokens used and reserved in the period.
    pub used: u64,
    /// Seconds since the Unix epoch when it renews.
    pub renews_at: u64,
    /// How long until it renews.
    pub renews_in: Duration,
}

impl OverBudget {
    /// `2026-12-02T00:00:00Z`.
    pub fn renews_at_rfc3339(&self) -> String {
        rfc3339(self.renews_at)
    }
}

/// A tenant's budgets, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetLimits {
    /// The tenant's name.
    pub name: Arc<str>,
    /// Tokens per day.
    pub daily: Option<u64>,
    /// Tokens per calendar month.
    pub monthly: Option<u64>,
}

/// One tenant's usage (what the state file keeps, and what the admin endpoint shows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The day (days since 1970-01-01) `day_tokens` counts.
    pub day: i64,
    /// Tokens used that day.
    pub day_tokens: u64,
    /// The month (`year × 12 + month − 1`) `month_tokens` counts.
    pub month: i64,
    /// Tokens used that month.
    pub month_tokens: u64,
    /// Tokens used since the state began.
    pub total_tokens: u64,
    /// Requests charged since the state began.
    pub requests: u64,
    /// Tokens reserved by requests running now (not kept in the file).
    #[serde(skip)]
    pub reserved: u64,
}

impl Usage {
    /// Starts new periods when `now` is past them.
    fn roll(&mut self, now: u64) {
        let (day, month) = (day_of(now), month_of(now));
        if self.day != day {
            self.day = day;
            self.day_tokens = 0;
        }
        if self.month != month {
            self.month = month;
            self.month_tokens = 0;
        }
    }
}

/// The state file's contents.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    tenants: BTreeMap<String, Usage>,
}

/// Budgets and usage of every configured tenant. Shared (`Arc`) by the gateway's requests.
pub struct Budgets {
    limits: arc_swap::ArcSwap<HashMap<TenantId, BudgetLimits>>,
    usage: Mutex<HashMap<Arc<str>, Usage>>,
    clock: WallClock,
    state_file: Option<PathBuf>,
    dirty: AtomicBool,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets").field("state_file", &self.state_file).finish_non_exhaustive()
    }
}

impl Budgets {
    /// Budgets for `limits`, usage read from `state_file` if it exists.
    ///
    /// # Errors
    ///
    /// A message when the state file exists but cannot be read or parsed.
    pub fn new(limits: Vec<BudgetLimits>, state_file: Option<PathBuf>, clock: WallClock) -> Result<Arc<Self>, String> {
        let mut usage = HashMap::new();
        if let Some(path) = &state_file {
            for (name, tenant) in read_state(path)?.tenants {
                usage.insert(Arc::from(name.as_str()), tenant);
            }
        }
        let budgets = Self {
            limits: arc_swap::ArcSwap::from_pointee(HashMap::new()),
            usage: Mutex::new(usage),
            clock,
            state_file,
            dirty: AtomicBool::new(false),
        };
        budgets.set_limits(limits);
        Ok(Arc::new(budgets))
    }

    /// Replaces the configured budgets (a reload); usage is kept.
    pub fn set_limits(&self, limits: Vec<BudgetLimits>) {
        let map = limits.into_iter().map(|l| (TenantId::from(&*l.name), l)).collect();
        self.limits.store(Arc::new(map));
    }

    fn now(&self) -> u64 {
        (self.clock)().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    /// Reserves `tokens` for a request of `tenant`: `Ok(None)` for a tenant that is not configured.
    ///
    /// # Errors
    ///
    /// [`OverBudget`] when the tenant's usage and reservations plus `tokens` would pass one of its
    /// budgets; nothing is reserved then.
    pub fn reserve(
        self: &Arc<Self>,
        tenant: TenantId,
        prompt: u32,
        tokens: u64,
    ) -> Result<Option<BudgetHold>, OverBudget> {
        let limits = self.limits.load();
        let Some(limits) = limits.get(&tenant) else { return Ok(None) };
        let now = self.now();
        let mut usage = self.usage.lock();
        let entry = usage.entry(Arc::clone(&limits.name)).or_default();
        entry.roll(now);
        for (period, limit, used) in
            [(Period::Day, limits.daily, entry.day_tokens), (Period::Month, limits.monthly, entry.month_tokens)]
        {
            let Some(limit) = limit else { continue };
            let used = used.saturating_add(entry.reserved);
            if used.saturating_add(tokens) > limit {
                let renews_at = renewal(period, now);
                return Err(OverBudget {
                    tenant: Arc::clone(&limits.name),
                    period,
                    limit,
                    used,
                    renews_at,
                    renews_in: Duration::from_secs(renews_at - now),
                });
            }
        }
        entry.reserved += tokens;
        Ok(Some(BudgetHold {
            budgets: Arc::clone(self),
            tenant: Arc::clone(&limits.name),
            prompt,
            reserved: tokens,
            settled: false,
        }))
    }

    /// Usage of every tenant seen, by name (periods rolled to now).
    pub fn usage(&self) -> BTreeMap<String, Usage> {
        let now = self.now();
        let mut usage = self.usage.lock();
        usage
            .iter_mut()
            .map(|(name, u)| {
                u.roll(now);
                (name.to_string(), *u)
            })
            .collect()
    }

    /// One tenant's usage and budgets.
    pub fn usage_of(&self, tenant: &str) -> (Usage, Option<BudgetLimits>) {
        let now = self.now();
        let mut usage = self.usage.lock();
        let mut u = usage.get(tenant).copied().unwrap_or_default();
        u.roll(now);
        if let Some(entry) = usage.get_mut(tenant) {
            *entry = u;
        }
        (u, self.limits.load().get(&TenantId::from(tenant)).cloned())
    }

    /// The configured budgets.
    pub fn limits(&self) -> Vec<BudgetLimits> {
        self.limits.load().values().cloned().collect()
    }

    /// Writes the state file if usage changed since the last write (no-op without a state file).
    ///
    /// # Errors
    ///
    /// The I/O error (the file stays as it was: it is replaced through a rename).
    pub fn save(&self) -> std::io::Result<()> {
        let Some(path) = &self.state_file else { return Ok(()) };
        if !self.dirty.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let state = StateFile { version: 1, tenants: self.usage() };
        let text = serde_json::to_vec_pretty(&state).expect("usage serializes");
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            self.dirty.store(true, Ordering::Release);
        }
        written
    }

    fn settle(&self, tenant: &str, reserved: u64, used: u64) {
        let now = self.now();
        let mut usage = self.usage.lock();
        let entry = usage.entry(Arc::from(tenant)).or_default();
        entry.roll(now);
        entry.reserved = entry.reserved.saturating_sub(reserved);
        entry.day_tokens = entry.day_tokens.saturating_add(used);
        entry.month_tokens = entry.month_tokens.saturating_add(used);
        entry.total_tokens = entry.total_tokens.saturating_add(used);
        entry.requests += 1;
        self.dirty.store(true, Ordering::Release);
    }

    fn release(&self, tenant: &str, reserved: u64) {
        if let Some(entry) = self.usage.lock().get_mut(tenant) {
            entry.reserved = entry.reserved.saturating_sub(reserved);
        }
    }
}

/// A request's reservation in its tenant's budgets. [`settle`](BudgetHold::settle) turns it into usage;
/// dropped unsettled (the request was refused, or never answered), it is given back and charges
/// nothing.
#[derive(Debug)]
pub struct BudgetHold {
    budgets: Arc<Budgets>,
    tenant: Arc<str>,
    prompt: u32,
    reserved: u64,
    settled: bool,
}

impl BudgetHold {
    /// Charges the prompt and `output` tokens (the whole output reservation when `None`: the count is
    /// unknown), at most the reservation.
    pub fn settle(mut self, output: Option<u32>) {
        let output_reserved = self.reserved.saturating_sub(u64::from(self.prompt));
        let used = (u64::from(self.prompt) + output.map_or(output_reserved, u64::from)).min(self.reserved);
        self.budgets.settle(&self.tenant, self.reserved, used);
        self.settled = true;
    }
}

impl Drop for BudgetHold {
    fn drop(&mut self) {
        if !self.settled {
            self.budgets.release(&self.tenant, self.reserved);
        }
    }
}

fn read_state(path: &Path) -> Result<StateFile, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            format!("--state-file {}: not a kvgate usage file ({e}); move it away to start afresh", path.display())
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StateFile::default()),
        Err(e) => Err(format!("--state-file {}: {e}", path.display())),
    }
}

fn day_of(secs: u64) -> i64 {
    (secs / 86_400) as i64
}

/// `year × 12 + month − 1` of a Unix time.
fn month_of(secs: u64) -> i64 {
    let (year, month, _) = civil(day_of(secs));
    year * 12 + i64::from(month) - 1
}

/// When the current `period` ends (seconds since the epoch).
fn renewal(period: Period, now: u64) -> u64 {
    match period {
        Period::Day => (now / 86_400 + 1) * 86_400,
        Period::Month => {
            let next = month_of(now) + 1;
            (days_from_civil(next.div_euclid(12), (next.rem_euclid(12) + 1) as u32, 1) * 86_400) as u64
        }
    }
}

/// The civil date of a day number (days since 1970-01-01), after Howard Hinnant's `civil_from_days`.
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The day number of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(secs: u64) -> String {
    let (year, month, day) = civil(day_of(secs));
    let rest = secs % 86_400;
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199), "2024-02-29T23:59:59Z");
        for days in [-1000, 0, 59, 60, 10_000, 20_000, 738_000] {
            let (y, m, d) = civil(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        // 2024-02-29 12:00 UTC: the day renews at midnight, the month on March 1st.
        let now = 1_709_208_000;
        assert_eq!(rfc3339(renewal(Period::Day, now)), "2024-03-01T00:00:00Z");
        assert_eq!(rfc3339(renewal(Period::Month, now)), "2024-03-01T00:00:00Z");
        // December rolls into January of the next year.
        assert_eq!(rfc3339(renewal(Period::Month, 1_734_000_000)), "2025-01-01T00:00:00Z");
    }

    fn clock_at(secs: &Arc<std::sync::atomic::AtomicU64>) -> WallClock {
        let secs = Arc::clone(secs);
        Arc::new(move || UNIX_EPOCH + Duration::from_secs(secs.load(Ordering::Relaxed)))
    }

    #[test]
    fn reservations_cannot_spend_past_a_budget_and_periods_roll() {
        // 2024-02-10 12:00 UTC.
        let secs = Arc::new(std::sync::atomic::AtomicU64::new(1_707_566_400));
        let limits = vec![BudgetLimits { name: "a".into(), daily: Some(1_000), monthly: Some(1_500) }];
        let budgets = Budgets::new(limits, None, clock_at(&secs)).unwrap();
        let a = TenantId::from("a");
        assert!(budgets.reserve(TenantId::from("nobody"), 1, 10).unwrap().is_none());
        let first = budgets.reserve(a, 100, 600).unwrap().unwrap();
        let refused = budgets.reserve(a, 100, 600).unwrap_err();
        assert_eq!(
            (refused.period, refused.used, refused.renews_at_rfc3339().as_str()),
            (Period::Day, 600, "2024-02-11T00:00:00Z")
        );
        first.settle(Some(150)); // 100 prompt + 150 output
        assert_eq!(budgets.usage_of("a").0.day_tokens, 250);
        drop(budgets.reserve(a, 100, 700).unwrap().unwrap()); // refused by admission: charges nothing
        budgets.reserve(a, 100, 700).unwrap().unwrap().settle(None); // unknown output: the whole reservation
        assert_eq!(budgets.usage_of("a").0.day_tokens, 950);
        assert_eq!(budgets.reserve(a, 1, 100).unwrap_err().period, Period::Day);
        secs.fetch_add(86_400, Ordering::Relaxed); // the next day, the same month
        let month = budgets.reserve(a, 1, 600).unwrap_err();
        assert_eq!((month.period, month.limit), (Period::Month, 1_500));
        budgets.reserve(a, 1, 500).unwrap().unwrap().settle(Some(0));
        let u = budgets.usage_of("a").0;
        assert_eq!((u.day_tokens, u.month_tokens, u.total_tokens, u.requests, u.reserved), (1, 951, 951, 3, 0));
    }

    #[test]
    fn usage_survives_a_restart_through_the_state_file() {
        let dir = std::env::temp_dir().join(format!("kvgate-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("usage.json");
        let _ = std::fs::remove_file(&path);
        let secs = Arc::new(std::sync::atomic::AtomicU64::new(1_709_208_000));
        let limits = || vec![BudgetLimits { name: "a".into(), daily: Some(1_000), monthly: None }];
        let budgets = Budgets::new(limits(), Some(path.clone()), clock_at(&secs)).unwrap();
        budgets.reserve(TenantId::from("a"), 10, 400).unwrap().unwrap().settle(Some(90));
        budgets.save().unwrap();
        drop(budgets);
        let again = Budgets::new(limits(), Some(path.clone()), clock_at(&secs)).unwrap();
        assert_eq!(again.usage_of("a").0.day_tokens, 100);
        std::fs::write(&path, "not json").unwrap();
        assert!(Budgets::new(limits(), Some(path), clock_at(&secs)).unwrap_err().contains("not a kvgate usage file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
