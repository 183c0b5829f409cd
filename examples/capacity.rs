//! How much KV cache a model needs, and how many sequences fit on a GPU.
//!
//! ```sh
//! cargo run --release --example capacity -- --model gemma-3-27b --gpu h100-80
//! cargo run --release --example capacity -- --model llama-3.1-8b --gpu l4 --kv-dtype fp8 --context 8192
//! cargo run --release --example capacity -- --config path/config.json --weight-gb 16 --gpu a100-80
//! cargo run --release --example capacity -- --model llama-3.1-8b --gpu l4 --engine llama.cpp --n-ctx 32768 \
//!     --parallel 4 --kv-dtype q8_0 --weight-dtype q4_0
//! cargo run --release --example capacity -- --model llama-3.1-8b --gpu h100-80 --users 300 --ttft-slo 2s
//! ```

use std::process::ExitCode;

use kvgate::kv::{Engine, GpuPlan, KvDtype, LayerKind, ModelSpec, WeightDtype};

const HELP: &str = "\
capacity: KV-cache bytes per sequence and concurrent sequences for a model on a GPU

USAGE:
    cargo run --release --example capacity -- --model NAME --gpu NAME [OPTIONS]

OPTIONS:
    --model NAME         model preset (layout and parameter count)
    --config PATH        read the layout from a Hugging Face config.json instead (feature hf-config);
                         weights come from --model's parameter count or --weight-gb
    --gpu NAME           GPU preset (required)
    --engine ENGINE      vllm (default: v1 with the hybrid KV-cache manager), vllm-uniform (manager off),
                         llama.cpp (slots allocated up front; give --n-ctx and --parallel)
    --n-ctx N            llama.cpp context, all slots together (default 32768)
    --parallel N         llama.cpp slots (default 4)
    --kv-dtype DTYPE     bf16 (default), fp16, fp32, fp8; q8_0, q4_0 with llama.cpp
    --weight-dtype DTYPE dtype of the weights when sized from the parameter count (default bf16; q4_0, q8_0)
    --weight-gb GB       weights of the whole model in GB (10^9 bytes), overriding the estimate
    --context N          context length for the capacity lines (default 32768; llama.cpp: one slot)
    --avg-context N      average context of a user (default: half of --context)
    --block-size N       tokens per block (default 16; 64 for MLA on Hopper)
    --chunk N            prefill chunk (vLLM's max_num_batched_tokens) for the prefill peak (default 8192)
    --tp N               tensor-parallel degree (default 1)
    --gpu-util F         fraction of GPU memory vLLM may use, in (0, 1] (default 0.9)
    --users N            plan for N employees: sweep the admission limits in the overload lab (kvgate::sim)
                         and print the gateway flags that keep p99 time to first token under --ttft-slo,
                         the goodput they give, and how many employees fit at that SLO with those limits
                         (searched the same way whatever N is; each count judged on 4,000+ requests)
    --ttft-slo DURATION  the time-to-first-token objective for --users (default 2s; e.g. 1500ms, 2s)
    -h, --help           this help
";

#[derive(Debug)]
struct Args {
    model: Option<String>,
    config: Option<String>,
    gpu: String,
    kv_dtype: KvDtype,
    weight_dtype: WeightDtype,
    weight_gb: Option<f64>,
    context: Option<u64>,
    avg_context: Option<u64>,
    block_size: Option<u32>,
    engine: String,
    n_ctx: u32,
    parallel: u32,
    chunk: u64,
    tp: u32,
    gpu_util: f64,
    users: Option<u32>,
    ttft_slo: std::time::Duration,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut model = None;
    let mut config = None;
    let mut gpu = None;
    let mut args = Args {
        model: None,
        config: None,
        gpu: String::new(),
        kv_dtype: KvDtype::Bf16,
        weight_dtype: WeightDtype::Bf16,
        weight_gb: None,
        context: None,
        avg_context: None,
        block_size: None,
        engine: "vllm".into(),
        n_ctx: 32_768,
        parallel: 4,
        chunk: 8192,
        tp: 1,
        gpu_util: 0.9,
        users: None,
        ttft_slo: std::time::Duration::from_secs(2),
    };
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (flag.clone(), None),
        };
        let known = [
            "--model",
            "--config",
            "--gpu",
            "--kv-dtype",
            "--weight-dtype",
            "--weight-gb",
            "--context",
            "--avg-context",
            "--block-size",
            "--tp",
            "--gpu-util",
            "--engine",
            "--n-ctx",
            "--parallel",
            "--chunk",
            "--users",
            "--ttft-slo",
        ];
        if !known.contains(&name.as_str()) {
            return Err(format!("unknown argument `{flag}` (see --help)"));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().ok_or_else(|| format!("{name} needs a value (see --help)"))?,
        };
        let bad = |what: &str| format!("invalid value `{value}` for {name}: expected {what}");
        match name.as_str() {
            "--model" => model = Some(value),
            "--config" => config = Some(value),
            "--gpu" => gpu = Some(value),
            "--kv-dtype" => args.kv_dtype = value.parse().map_err(|e| format!("{name}: {e}"))?,
            "--weight-dtype" => args.weight_dtype = value.parse().map_err(|e| format!("{name}: {e}"))?,
            "--weight-gb" => {
                let gb: f64 = value.parse().map_err(|_| bad("a number of GB"))?;
                if !(gb.is_finite() && gb >= 0.0) {
                    return Err(bad("a non-negative number of GB"));
                }
                args.weight_gb = Some(gb);
            }
            "--context" => args.context = Some(value.parse().map_err(|_| bad("a token count"))?),
            "--avg-context" => args.avg_context = Some(value.parse().map_err(|_| bad("a token count"))?),
            "--block-size" => args.block_size = Some(value.parse().map_err(|_| bad("a positive integer"))?),
            "--engine" => args.engine = value.clone(),
            "--n-ctx" => args.n_ctx = value.parse().map_err(|_| bad("a token count"))?,
            "--parallel" => args.parallel = value.parse().map_err(|_| bad("a positive integer"))?,
            "--chunk" => args.chunk = value.parse().map_err(|_| bad("a token count"))?,
            "--tp" => args.tp = value.parse().map_err(|_| bad("a positive integer"))?,
            "--gpu-util" => args.gpu_util = value.parse().map_err(|_| bad("a fraction in (0, 1]"))?,
            "--users" => args.users = Some(value.parse().map_err(|_| bad("a positive number of employees"))?),
            "--ttft-slo" => {
                args.ttft_slo = parse_duration(&value).ok_or_else(|| bad("a duration such as 2s or 1500ms"))?
            }
            _ => unreachable!("checked against the known flags"),
        }
    }
    if model.is_none() && config.is_none() {
        return Err("give --model NAME or --config PATH (see --help)".into());
    }
    args.gpu = gpu.ok_or("give --gpu NAME (see --help)")?;
    args.model = model;
    args.config = config;
    Ok(Some(args))
}

/// The limits that keep `users` employees within the TTFT objective, found in the overload lab, and how
/// many employees fit with them (a figure that depends on the limits, not on `users`).
#[cfg(feature = "sim")]
fn plan_for(plan: &GpuPlan, args: &Args, users: u32) -> Result<(), String> {
    use kvgate::sim::{EngineConfig, PlanRequest};
    let engine = EngineConfig::for_plan(plan, args.weight_dtype).map_err(|e| e.to_string())?;
    let request = PlanRequest::new(plan.clone(), engine, users, args.ttft_slo);
    let recommendation = kvgate::sim::plan(&request).map_err(|e| e.to_string())?;
    println!();
    println!("{recommendation}");
    Ok(())
}

#[cfg(not(feature = "sim"))]
fn plan_for(_plan: &GpuPlan, _args: &Args, _users: u32) -> Result<(), String> {
    Err("--users needs the `sim` feature (on for the examples)".into())
}

/// `2s`, `1500ms`, `0.5s`: a positive, finite duration.
fn parse_duration(text: &str) -> Option<std::time::Duration> {
    let (number, scale) = match text.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (text.strip_suffix('s').unwrap_or(text), 1.0),
    };
    let seconds = number.trim().parse::<f64>().ok()? * scale;
    std::time::Duration::try_from_secs_f64(seconds).ok().filter(|d| !d.is_zero())
}

fn load_spec(args: &Args) -> Result<ModelSpec, String> {
    let preset = args.model.as_deref().map(ModelSpec::preset).transpose().map_err(|e| e.to_string())?;
    let Some(path) = &args.config else {
        return Ok(preset.expect("checked: --model or --config"));
    };
    let json = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    from_config(&json, path).map(|spec| {
        // Keep the preset's parameter count for weight sizing, when one was named.
        match preset.and_then(|p| p.params()) {
            Some(params) => rebuild_with_params(&spec, params),
            None => spec,
        }
    })
}

#[cfg(feature = "hf-config")]
fn from_config(json: &str, path: &str) -> Result<ModelSpec, String> {
    ModelSpec::from_hf_config(json).map_err(|e| format!("{path}: {e}"))
}

#[cfg(not(feature = "hf-config"))]
fn from_config(_json: &str, _path: &str) -> Result<ModelSpec, String> {
    Err("--config needs the `hf-config` feature (on by default)".into())
}

fn engine(args: &Args) -> Result<Engine, String> {
    match args.engine.to_ascii_lowercase().as_str() {
        "llama.cpp" | "llamacpp" | "llama-cpp" | "ollama" => {
            Engine::llama_cpp(args.n_ctx, args.parallel).map_err(|e| e.to_string())
        }
        name => name.parse().map_err(|e: kvgate::ConfigError| format!("--engine: {e}, llama.cpp")),
    }
}

fn rebuild_with_params(spec: &ModelSpec, params: u64) -> ModelSpec {
    spec.groups()
        .iter()
        .fold(ModelSpec::builder(spec.name()), |b, g| b.group(g.layers(), g.kind()))
        .params(params)
        .build()
        .expect("rebuilt from a valid spec")
}

fn gb(bytes: u64) -> String {
    format!("{:.2} GB ({})", bytes as f64 / 1e9, gib(bytes))
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn layout_text(spec: &ModelSpec) -> String {
    spec.groups().iter().map(|g| format!("{} x {}", g.layers(), g.kind())).collect::<Vec<_>>().join("; ")
}

fn run(args: &Args) -> Result<(), String> {
    let spec = load_spec(args)?;
    if spec.params().is_none() && args.weight_gb.is_none() {
        return Err(format!(
            "the weight size of {} is unknown: give --weight-gb, or --model with a preset of the same model",
            spec.name()
        ));
    }
    let engine = engine(args)?;
    let mut builder = GpuPlan::builder(spec.clone())
        .gpu(&args.gpu)
        .engine(engine)
        .kv_dtype(args.kv_dtype)
        .weight_dtype(args.weight_dtype)
        .tensor_parallel(args.tp)
        .memory_utilization(args.gpu_util);
    if let Some(block) = args.block_size {
        builder = builder.block_size(block);
    }
    if let Some(weight_gb) = args.weight_gb {
        builder = builder.weight_bytes((weight_gb * 1e9) as u64);
    }
    let plan = builder.build().map_err(|e| e.to_string())?;
    let dtype = args.kv_dtype;
    let layout = plan.layout();
    let block = plan.block_size();

    println!("model {} on {} x {}, KV cache {dtype}, engine {engine}", spec.name(), args.tp, args.gpu);
    println!("layers: {}", layout_text(&spec));
    let has_windows =
        spec.groups().iter().any(|g| matches!(g.kind(), LayerKind::Sliding { .. } | LayerKind::ChunkedLocal { .. }));
    print!("KV bytes per token: {}", spec.bytes_per_token(dtype));
    if has_windows {
        print!(" inside the windows, {} past them", spec.bytes_per_token_past_windows(dtype));
    }
    println!();
    if engine.is_vllm() {
        println!(
            "vLLM layout: blocks of {block} tokens, {} group(s) of {} layers, {} bytes per block id",
            layout.num_groups(),
            layout.group_size(),
            layout.block_bytes()
        );
    }
    println!();

    let per_gpu = plan.per_gpu_model();
    println!(
        "| context | naive (every layer full) |      per layer, paged | {:>21} | exact / naive |",
        engine_label(engine)
    );
    println!("|--------:|-------------------------:|----------------------:|----------------------:|--------------:|");
    for tokens in [4096u64, 8192, 16_384, 32_768, 131_072] {
        let naive = spec.kv_bytes_naive(tokens, dtype);
        let paged = spec.kv_bytes_paged(tokens, dtype, if engine.is_vllm() { block } else { 1 });
        let exact = plan.sequence_bytes(tokens);
        let fits = engine.slot_tokens().is_none_or(|slot| tokens <= slot);
        let exact_text = if fits { gb(exact) } else { "longer than a slot".into() };
        let ratio = if fits { format!("{:.1}%", 100.0 * exact as f64 / naive as f64) } else { "-".into() };
        println!(
            "| {:>6}k | {:>24} | {:>21} | {:>21} | {:>13} |",
            tokens / 1024,
            gb(naive),
            gb(paged),
            exact_text,
            ratio
        );
    }

    let per_gpu_weights = plan.weight_bytes().div_ceil(u64::from(plan.tensor_parallel()));
    println!();
    println!(
        "per GPU: {} x {} = {} usable - weights {} - reserve {} = KV pool {}",
        gib(plan.gpu_memory_bytes()),
        plan.memory_utilization(),
        gib((plan.gpu_memory_bytes() as f64 * plan.memory_utilization()) as u64),
        gib(per_gpu_weights),
        gib(plan.reserve_bytes()),
        gib(plan.kv_pool_bytes_per_gpu()),
    );
    let context = args.context.or(engine.slot_tokens()).unwrap_or(32_768);
    let avg = args.avg_context.unwrap_or(context / 2);
    let naive_per_seq = per_gpu.kv_bytes_naive(context, dtype);
    let naive_fit = plan.kv_pool_bytes_per_gpu().checked_div(naive_per_seq).unwrap_or(u64::MAX);
    match (engine.slots(), engine.slot_tokens()) {
        (Some(slots), Some(slot)) => {
            println!(
                "llama.cpp: {slots} slots of {slot} tokens, {} each, allocated up front ({} of the pool)",
                gb(plan.block_bytes_per_gpu()),
                gib(plan.block_bytes_per_gpu() * slots)
            );
            println!(
                "concurrent sequences of {context} tokens: {} (the naive estimate says {naive_fit})",
                plan.max_sequences(context)
            );
        }
        _ => {
            println!(
                "blocks: {} of {} bytes per GPU (one is the null block); vLLM logs \"GPU KV cache size: {} tokens\"",
                plan.num_blocks(),
                plan.block_bytes_per_gpu(),
                plan.kv_cache_tokens()
            );
            println!(
                "concurrent sequences of {context} tokens: {} (the naive estimate says {naive_fit})",
                plan.max_sequences(context)
            );
            println!("concurrent users at an average context of {avg} tokens: {}", plan.users_at_average_context(avg));
            if has_windows {
                println!(
                    "prefill peak of a {context}-token prompt in chunks of {}: {} (sliding layers hold window + chunk), \
                     {} at steady decode",
                    args.chunk,
                    gb(plan.prefill_peak_bytes(context, args.chunk)),
                    gb(plan.sequence_bytes(context))
                );
            }
        }
    }
    if let Some(users) = args.users {
        plan_for(&plan, args, users)?;
    }
    Ok(())
}

fn engine_label(engine: Engine) -> &'static str {
    match engine {
        Engine::Vllm => "exact (vLLM)",
        Engine::VllmUniform => "exact (uniform)",
        _ => "llama.cpp slot",
    }
}

fn main() -> ExitCode {
    match parse_args(std::env::args().skip(1)) {
        Ok(None) => {
            print!("{HELP}");
            println!("\nmodel presets: {}", ModelSpec::preset_names().join(", "));
            println!("GPU presets:   {}", GpuPlan::gpu_names().join(", "));
            ExitCode::SUCCESS
        }
        Ok(Some(args)) => match run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
