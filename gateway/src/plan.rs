//! What a [`Config`] makes: the front admission (global rates, tenants, the waiting room; capacity = the
//! sum of the upstreams') and one admission per upstream (its own in-flight cap and KV budget).
//! Every mistake is a [`ConfigError`] here, before anything listens.

use crate::config::{BackendConfig, Config, ConfigError, UpstreamConfig};
use crate::limiter::Limiter;
use crate::proxy::Proxy;
use crate::sim::{SimBackend, SimConfig};
use crate::upstream::{Backend, Upstream};
use kvgate::kv::GpuPlan;
use kvgate::{Admission, AdmissionBuilder};
use std::sync::Arc;

/// One upstream's KV budget, before it is built.
#[derive(Debug, Clone)]
pub enum KvBudget {
    /// No budget.
    Unlimited,
    /// In tokens.
    Tokens(u64),
    /// In bytes of the gateway's model on a GPU.
    Plan(Box<GpuPlan>),
}

/// One upstream's limits, resolved from its settings and the gateway's.
#[derive(Debug, Clone)]
pub struct UpstreamSpec {
    /// Its name.
    pub name: Arc<str>,
    /// Its settings.
    pub config: UpstreamConfig,
    /// Sequences at once.
    pub slots: usize,
    /// Its KV budget.
    pub kv: KvBudget,
}

impl KvBudget {
    /// The budget in its unit (`None`: unlimited).
    pub fn units(&self) -> Option<u64> {
        match self {
            KvBudget::Unlimited => None,
            KvBudget::Tokens(n) => Some(*n),
            KvBudget::Plan(plan) => Some(plan.kv_budget_bytes()),
        }
    }
}

/// The upstreams a configuration names: its `[[upstream]]` tables, or the one of its flat settings.
pub fn upstream_configs(config: &Config) -> Vec<UpstreamConfig> {
    if !config.upstreams.is_empty() {
        return config.upstreams.clone();
    }
    let (name, url, sim) = match &config.backend {
        BackendConfig::Simulated { tokens_per_sec } => ("sim", None, Some(*tokens_per_sec)),
        BackendConfig::Upstream(url) => ("upstream", Some(url.clone()), None),
    };
    vec![UpstreamConfig {
        name: Some(name.into()),
        url,
        sim_tokens_per_sec: sim,
        api_key: None,
        max_in_flight: Some(config.max_in_flight),
        kv_tokens: config.kv_tokens,
        gpu: config.gpu.clone(),
        weight_gb: config.weight_gb,
        health_path: None,
    }]
}

/// Resolves every upstream's limits.
///
/// # Errors
///
/// [`ConfigError`] for two upstreams of one name, both a token and a byte budget, a budget in bytes
/// next to one in tokens, or a model or GPU that cannot be planned.
pub fn upstream_specs(config: &Config) -> Result<Vec<UpstreamSpec>, ConfigError> {
    let mut specs: Vec<UpstreamSpec> = Vec::new();
    for (i, upstream) in upstream_configs(config).into_iter().enumerate() {
        let name: Arc<str> = upstream.name.clone().unwrap_or_else(|| format!("upstream-{}", i + 1)).into();
        if name.is_empty() || specs.iter().any(|s| s.name == name) {
            return Err(ConfigError::Conflict(format!("[[upstream]] names must be unique and not empty: {name:?}")));
        }
        let slots = upstream.max_in_flight.unwrap_or(config.max_in_flight);
        if slots == 0 {
            return Err(ConfigError::Conflict(format!("upstream {name:?}: max_in_flight must be at least 1")));
        }
        let plan = config.plan_for(upstream.gpu.as_deref(), upstream.weight_gb.or(config.weight_gb))?;
        let kv = match (plan, upstream.kv_tokens) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Conflict(format!(
                    "upstream {name:?}: give either kv_tokens or gpu (with the gateway's model), not both"
                )));
            }
            (Some(plan), None) => KvBudget::Plan(Box::new(plan)),
            (None, Some(0)) => {
                return Err(ConfigError::Conflict(format!("upstream {name:?}: kv_tokens must be at least 1")));
            }
            (None, Some(tokens)) => KvBudget::Tokens(tokens),
            (None, None) if config.model_config.is_some() && config.gpu.is_none() && upstream.gpu.is_none() => {
                return Err(ConfigError::Conflict("--model-config sets a KV-byte budget only with --gpu NAME".into()));
            }
            (None, None) => KvBudget::Unlimited,
        };
        specs.push(UpstreamSpec { name, config: upstream, slots, kv });
    }
    let bytes = specs.iter().filter(|s| matches!(s.kv, KvBudget::Plan(_))).count();
    let tokens = specs.iter().filter(|s| matches!(s.kv, KvBudget::Tokens(_))).count();
    if bytes > 0 && tokens > 0 {
        return Err(ConfigError::Conflict(
            "upstreams mix KV budgets in bytes (gpu) and in tokens (kv_tokens): use one unit for all".into(),
        ));
    }
    Ok(specs)
}

fn common(config: &Config, builder: AdmissionBuilder) -> AdmissionBuilder {
    match config.prefix_sharing {
        Some(n) => builder.prefix_sharing(n),
        None => builder,
    }
}

/// The admission of one upstream's own capacity: never waits (the dispatcher does).
///
/// # Errors
///
/// As the admission's builder.
pub fn upstream_admission(config: &Config, spec: &UpstreamSpec) -> Result<Admission, ConfigError> {
    let mut builder = common(config, Admission::builder().max_in_flight(spec.slots).queue_capacity(0));
    builder = match &spec.kv {
        KvBudget::Unlimited => builder,
        KvBudget::Tokens(n) => builder.kv_capacity_tokens(*n),
        KvBudget::Plan(plan) => builder.gpu_plan(plan),
    };
    Ok(builder.build()?)
}

/// Sequences and KV units of the in-service upstreams, summed (`None` KV: some upstream is unlimited).
pub fn capacity_sum<'a>(specs: impl Iterator<Item = (usize, Option<u64>)> + 'a) -> (usize, Option<u64>) {
    specs.fold((0usize, Some(0u64)), |(slots, kv), (s, k)| {
        (slots.saturating_add(s), kv.zip(k).map(|(a, b)| a.saturating_add(b)))
    })
}

/// The front admission: the gateway's rates, tenants and waiting room, with `slots` and `kv` (the
/// upstreams' sum) as its capacity. With `shared_rates`, rates are left to the shared limits.
///
/// # Errors
///
/// As the admission's builder.
pub fn front_admission(config: &Config, specs: &[UpstreamSpec], shared_rates: bool) -> Result<Admission, ConfigError> {
    let (slots, kv) = capacity_sum(specs.iter().map(|s| (s.slots, s.kv.units())));
    let mut builder = common(
        config,
        Admission::builder()
            .max_in_flight(slots.max(1))
            .queue_capacity(config.queue)
            .max_queue_wait(config.max_queue_wait)
            .wait_policy(config.wait_policy)
            .fairness(config.fairness),
    );
    if !shared_rates {
        if let Some((rate, burst)) = config.rate {
            builder = builder.request_rate(rate, burst);
        }
        if let Some((rate, burst)) = config.token_rate {
            builder = builder.token_rate(rate, burst);
        }
    }
    let plan = specs.iter().find_map(|s| match &s.kv {
        KvBudget::Plan(plan) => Some(plan),
        _ => None,
    });
    builder = match (plan, kv) {
        (_, None) => builder,
        (Some(plan), Some(bytes)) => builder.gpu_plan(plan).kv_capacity_bytes(bytes),
        (None, Some(tokens)) => builder.kv_capacity_tokens(tokens.max(1)),
    };
    let limits = |l: &crate::tenants::TenantLimitsConfig| {
        let mut l = l.clone();
        if shared_rates {
            (l.request_rate, l.request_burst, l.token_rate, l.token_burst) = (None, None, None, None);
        }
        l.to_limits()
    };
    if let Some(defaults) = &config.tenant_defaults {
        builder = builder.tenant_defaults(limits(defaults));
    }
    for tenant in &config.tenants {
        let own = tenant.limits.or(config.tenant_defaults.as_ref());
        builder = builder.tenant_limits(tenant.name.as_str(), limits(&own));
    }
    if config.tenant_header.is_some() || config.tenant_from_user {
        // Tenants named by clients: fair queueing between them even without limits of their own.
        builder = builder.tenant_defaults(config.tenant_defaults.as_ref().map(limits).unwrap_or_default());
    }
    Ok(builder.build()?)
}

/// Builds the upstreams (engines and admissions) of `specs`, with `limiter` deciding where each one's
/// limits are kept.
///
/// # Errors
///
/// A [`ConfigError`] for an upstream URL or key that is not valid.
pub fn upstreams(
    config: &Config,
    specs: &[UpstreamSpec],
    limiters: Vec<Limiter>,
) -> Result<Vec<Arc<Upstream>>, ConfigError> {
    specs
        .iter()
        .zip(limiters)
        .map(|(spec, limiter)| {
            let backend = match &spec.config.url {
                None => Backend::Simulated(SimBackend::new(SimConfig {
                    tokens_per_sec: spec.config.sim_tokens_per_sec.unwrap_or(50.0),
                    slowdown_per_seq: 0.02,
                    max_seqs: spec.slots,
                    kv_budget: spec.kv.units().unwrap_or(u64::MAX),
                })),
                Some(url) => {
                    let key = spec.config.api_key.as_deref().or(config.upstream_api_key.as_deref());
                    Backend::Upstream(Box::new(
                        Proxy::new(url, config.upstream_timeout, key).map_err(ConfigError::Conflict)?,
                    ))
                }
            };
            Ok(Arc::new(Upstream::new(
                Arc::clone(&spec.name),
                backend,
                limiter,
                spec.config.health_path.clone(),
                config.max_fails,
            )))
        })
        .collect()
}
