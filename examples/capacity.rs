//! How much KV cache a model needs, and how many sequences fit on a GPU.
//!
//! ```sh
//! cargo run --release --example capacity -- --model gemma-3-27b --gpu h100-80
//! cargo run --release --example capacity -- --model llama-3.1-8b --gpu l4 --kv-dtype fp8 --context 8192
//! cargo run --release --example capacity -- --config path/config.json --weight-gb 16 --gpu a100-80
//! ```

use std::process::ExitCode;

use kvgate::kv::{GpuPlan, KvDtype, LayerKind, ModelSpec};

const HELP: &str = "\
capacity: KV-cache bytes per sequence and concurrent sequences for a model on a GPU

USAGE:
    cargo run --release --example capacity -- --model NAME --gpu NAME [OPTIONS]

OPTIONS:
    --model NAME         model preset (layout and parameter count)
    --config PATH        read the layout from a Hugging Face config.json instead (feature hf-config);
                         weights come from --model's parameter count or --weight-gb
    --gpu NAME           GPU preset (required)
    --kv-dtype DTYPE     bf16 (default), fp16, fp32, fp8
    --weight-dtype DTYPE dtype of the weights when sized from the parameter count (default bf16)
    --weight-gb GB       weights of the whole model in GB (10^9 bytes), overriding the estimate
    --context N          context length for the capacity lines (default 32768)
    --avg-context N      average context of a user (default: half of --context)
    --block-size N       tokens per block (default 16)
    --tp N               tensor-parallel degree (default 1)
    --gpu-util F         fraction of GPU memory vLLM may use, in (0, 1] (default 0.9)
    -h, --help           this help
";

#[derive(Debug)]
struct Args {
    model: Option<String>,
    config: Option<String>,
    gpu: String,
    kv_dtype: KvDtype,
    weight_dtype: KvDtype,
    weight_gb: Option<f64>,
    context: u64,
    avg_context: Option<u64>,
    block_size: u32,
    tp: u32,
    gpu_util: f64,
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
        weight_dtype: KvDtype::Bf16,
        weight_gb: None,
        context: 32_768,
        avg_context: None,
        block_size: 16,
        tp: 1,
        gpu_util: 0.9,
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
            "--context" => args.context = value.parse().map_err(|_| bad("a token count"))?,
            "--avg-context" => args.avg_context = Some(value.parse().map_err(|_| bad("a token count"))?),
            "--block-size" => args.block_size = value.parse().map_err(|_| bad("a positive integer"))?,
            "--tp" => args.tp = value.parse().map_err(|_| bad("a positive integer"))?,
            "--gpu-util" => args.gpu_util = value.parse().map_err(|_| bad("a fraction in (0, 1]"))?,
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

fn layout(spec: &ModelSpec) -> String {
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
    let mut builder = GpuPlan::builder(spec.clone())
        .gpu(&args.gpu)
        .kv_dtype(args.kv_dtype)
        .weight_dtype(args.weight_dtype)
        .block_size(args.block_size)
        .tensor_parallel(args.tp)
        .memory_utilization(args.gpu_util);
    if let Some(weight_gb) = args.weight_gb {
        builder = builder.weight_bytes((weight_gb * 1e9) as u64);
    }
    let plan = builder.build().map_err(|e| e.to_string())?;
    let (dtype, block) = (args.kv_dtype, args.block_size);

    println!("model {} on {} x {}, KV cache {dtype}, blocks of {block} tokens", spec.name(), args.tp, args.gpu);
    println!("layers: {}", layout(&spec));
    let has_windows = spec.groups().iter().any(|g| matches!(g.kind(), LayerKind::Sliding { .. }));
    print!("KV bytes per token: {}", spec.bytes_per_token(dtype));
    if has_windows {
        print!(" inside the windows, {} past them", spec.bytes_per_token_past_windows(dtype));
    }
    println!("\n");

    println!("| context | naive (every layer full) |    real (vLLM, paged) | real / naive |");
    println!("|--------:|-------------------------:|----------------------:|-------------:|");
    for tokens in [4096u64, 8192, 16_384, 32_768, 131_072] {
        let naive = spec.kv_bytes_naive(tokens, dtype);
        let real = spec.kv_bytes_paged(tokens, dtype, block);
        println!(
            "| {:>6}k | {:>24} | {:>21} | {:>11.1}% |",
            tokens / 1024,
            gb(naive),
            gb(real),
            100.0 * real as f64 / naive as f64
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
    println!(
        "blocks: {} of {} bytes per GPU = {} tokens cached in every layer",
        plan.num_blocks(),
        plan.block_bytes_per_gpu(),
        plan.max_tokens()
    );
    let context = args.context;
    let avg = args.avg_context.unwrap_or(context / 2);
    let naive_per_seq = plan.per_gpu_model().kv_bytes_naive(context, dtype);
    let naive_fit = plan.kv_pool_bytes_per_gpu().checked_div(naive_per_seq).unwrap_or(u64::MAX);
    println!(
        "concurrent sequences of {context} tokens: {} (the naive estimate says {naive_fit})",
        plan.max_sequences(context)
    );
    println!("concurrent users at an average context of {avg} tokens: {}", plan.users_at_average_context(avg));
    Ok(())
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
