//! The `cudamem` command. Each subcommand is a small function over the library crates; this
//! file only parses arguments and prints.
//!
//! Output goes through [`out!`] and [`outln!`], which return a write error to the caller instead
//! of panicking as `println!` does: a closed stdout (`cudamem compare ... | head -1`) ends the
//! command quietly with exit status 0, and every other error prints its message (`Display`)
//! with exit status 2.

/// `print!` that returns a failed write as [`CliError::Write`] from the calling function.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*).map_err($crate::CliError::Write)?
    }};
}

/// `println!` that returns a failed write as [`CliError::Write`] from the calling function.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::CliError::Write)?
    }};
}

mod demo;
mod fidelity;
mod files;
mod replay_cmd;
mod report_cmds;
mod scale_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cudamem_alloc::size::human;
use cudamem_replay::ReplayOptions;
use files::load;
use indicatif::{ProgressBar, ProgressStyle};
use replay_cmd::to_json;
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "cudamem",
    version,
    about = "A GPU caching allocator with PyTorch's semantics: replay, compare and size real memory traces"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show caching, empty_cache, stats, memory_summary and an out-of-memory error on a
    /// simulated GPU.
    Demo {
        /// Simulated GPU memory.
        #[arg(long, default_value = "8GiB", value_parser = cudamem_estimate::gpu_capacity, allow_hyphen_values = true,
              help = capacity_help("Simulated GPU memory"))]
        capacity: u64,
    },
    /// Replay a PyTorch memory snapshot (or RMM log, or cudamem trace) on a simulated GPU (or a
    /// real one with --device cuda:N).
    Replay {
        /// The trace file (.pickle, .pickle.gz, RMM .csv, cudamem .cmt).
        trace: PathBuf,
        /// The policy (one of those the help lists).
        #[arg(long, help = policy_help(&format!("The policy (default: the policy key of --config, else {})", cudamem_alloc::policy::registry::DEFAULT), false))]
        policy: Option<String>,
        /// Allocator settings over the trace's own, in PYTORCH_CUDA_ALLOC_CONF syntax.
        #[arg(long)]
        config: Option<String>,
        /// Simulated GPU memory (default: an H200's, 150109880320 bytes).
        // Hyphen values reach the size parser, which says what is wrong with a negative size.
        #[arg(long, value_parser = cudamem_estimate::gpu_capacity, allow_hyphen_values = true,
              help = capacity_help("Simulated GPU memory (default: an H200's, 150109880320 bytes)"))]
        capacity: Option<u64>,
        /// Timed repetitions for replay_ns_per_op.
        #[arg(long, default_value_t = 5, allow_hyphen_values = true, value_parser = whole::<usize>)]
        repeats: usize,
        /// Where to replay: sim (the simulated GPU), sim:<capacity> (sim:8GiB), cuda or cuda:N (a
        /// real GPU), or auto (cuda:0 if a GPU is present, else sim), as the Rust API reads them.
        #[arg(long, default_value = "sim")]
        device: String,
        /// Time warm passes (the cache already filled by a first pass), as a training loop's
        /// later steps see it.
        #[arg(long)]
        warm: bool,
        /// Place every segment on the simulated GPU instead of at the trace's recorded
        /// addresses: lowest (the lowest free range), highest (the top of the highest one) or
        /// shuffled:SEED (a seeded random order, as the driver's order changes between runs).
        #[arg(long)]
        placement: Option<cudamem_device::sim::Placement>,
        /// Print exactly one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Replay several traces with several policies and print one table.
    Compare {
        /// Trace files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
        /// Comma-separated policies.
        #[arg(long, alias = "policy", help = policy_help(&format!("Comma-separated policies (default: the policy key of --config, else {})", *DEFAULT_POLICIES), true))]
        policies: Option<String>,
        /// Allocator settings applied to every run.
        #[arg(long)]
        config: Option<String>,
        /// Timed repetitions per run.
        #[arg(long, default_value_t = 3, allow_hyphen_values = true, value_parser = whole::<usize>)]
        repeats: usize,
        /// Time warm passes (the cache already filled by a first pass) instead of passes on a
        /// fresh allocator each.
        #[arg(long)]
        warm: bool,
        /// Print a JSON array of replay objects.
        #[arg(long)]
        json: bool,
    },
    /// Find the smallest GPU memory on which the trace replays without an out-of-memory error.
    Fit {
        /// The trace file.
        trace: PathBuf,
        /// Comma-separated policies.
        #[arg(long, alias = "policies", help = policy_help(&format!("Comma-separated policies (default: the policy key of --config, else {})", *DEFAULT_POLICIES), true))]
        policy: Option<String>,
        /// Allocator settings over the trace's own.
        #[arg(long)]
        config: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The fidelity table: each trace's own segment history next to its replay with PyTorch's
    /// policy (and the live expandable-segments peak saved beside the trace, if any).
    Fidelity {
        /// Trace files.
        #[arg(required = true)]
        traces: Vec<PathBuf>,
    },
    /// Scale traces of one job at small batch sizes to a larger batch: its peak reserved memory
    /// and the largest batch that fits a GPU (see docs/guide/will-it-fit.md).
    Scale(scale_cmd::ScaleArgs),
    // Reports: summary, leaks, why, viz (see report_cmds.rs).
    #[command(flatten)]
    Report(report_cmds::ReportCommand),
}

/// Why a command stopped: a message for the user, or a write to stdout that failed.
#[derive(Debug)]
pub enum CliError {
    /// A message naming what is wrong (a bad argument, a bad file, a refused replay).
    Msg(String),
    /// Writing to stdout failed; a closed pipe is not an error of the command.
    Write(std::io::Error),
}

impl From<String> for CliError {
    fn from(s: String) -> Self {
        CliError::Msg(s)
    }
}

impl From<&str> for CliError {
    fn from(s: &str) -> Self {
        CliError::Msg(s.to_string())
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Msg(m) => f.write_str(m),
            CliError::Write(e) => write!(f, "cannot write to stdout: {e}"),
        }
    }
}

/// What a command returns.
pub type CliResult = Result<(), CliError>;

/// The exit status and message of a command's result.
fn exit(r: CliResult) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`| head`): what it wanted was written.
        Err(CliError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudamem: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Demo { capacity } => demo::run(capacity),
        Command::Replay {
            trace,
            policy,
            config,
            capacity,
            repeats,
            device,
            warm,
            placement,
            json,
        } => replay_cmd::run(
            &trace,
            replay_cmd::ReplayArgs {
                policy,
                config,
                capacity,
                repeats,
                device,
                warm,
                placement,
            },
            json,
        ),
        Command::Fidelity { traces } => fidelity::run(&traces),
        Command::Compare {
            traces,
            policies,
            config,
            repeats,
            warm,
            json,
        } => cmd_compare(&traces, policies.as_deref(), config, Timing { repeats, warm }, json),
        Command::Fit {
            trace,
            policy,
            config,
            json,
        } => cmd_fit(&trace, policy.as_deref(), config, json),
        Command::Report(cmd) => report_cmds::run(cmd),
        Command::Scale(a) => scale_cmd::run(a),
    };
    exit(r)
}

/// What `compare` and `fit` run when no policy is named (the registry's choice).
static DEFAULT_POLICIES: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(cudamem_alloc::policy::registry::default_policies);

/// A policy option's help, listing the policies the registry knows.
pub(crate) fn policy_help(what: &str, list: bool) -> String {
    cudamem_alloc::policy::registry::help(what, list)
}

/// A capacity option's help: `what`, then what a value may be (a GPU name or a size, and the
/// size units).
/// A whole number of 0 or more, for every count and index option. Hyphen values reach it (the
/// options say `allow_hyphen_values`), so that a negative number gets this message and not
/// clap's tip to put `--` before it, which would make it a file name.
pub(crate) fn whole<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    let t = s.trim();
    if let Some(rest) = t.strip_prefix('-') {
        if !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_digit()) {
            return Err(format!("must be 0 or more, not {t}"));
        }
    }
    t.parse::<T>()
        .map_err(|_| format!("not a whole number: '{t}' (digits only, for example 8)"))
}

pub(crate) fn capacity_help(what: &str) -> String {
    format!(
        "{what}: a GPU name ({}) or a size ({}); under 1 MiB is refused",
        cudamem_estimate::gpu_names(),
        cudamem_alloc::size::UNITS_HELP
    )
}

/// The policies a command runs: those given, else the `policy:` key of `config`, else
/// `default`. Warns on stderr about an `expandable_segments` setting a policy does not follow.
pub(crate) fn chosen_policies(given: Option<&str>, config: Option<&str>, default: &str) -> Result<Vec<String>, String> {
    let from_config = config
        .and_then(|c| cudamem_alloc::AllocatorConfig::parse(c).ok())
        .and_then(|c| c.policy);
    let pols = policies(given.or(from_config.as_deref()).unwrap_or(default))?;
    for p in &pols {
        if let Some(w) = config.and_then(|c| cudamem_alloc::policy::registry::ignored_expandable_setting(p, c)) {
            eprintln!("cudamem: warning: --config: {w}");
        }
    }
    Ok(pols)
}

fn policies(list: &str) -> Result<Vec<String>, String> {
    let v: Vec<String> = list
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for p in &v {
        let mut cfg = cudamem_alloc::AllocatorConfig::default();
        cudamem_alloc::policy::by_name(p, &mut cfg)?;
    }
    if v.is_empty() {
        return Err("no policy given".into());
    }
    Ok(v)
}

fn bar(len: u64, hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("static template"));
    pb
}

/// How `compare` times its replays.
struct Timing {
    repeats: usize,
    warm: bool,
}

fn cmd_compare(paths: &[PathBuf], list: Option<&str>, config: Option<String>, timing: Timing, json: bool) -> CliResult {
    let pols = chosen_policies(list, config.as_deref(), &DEFAULT_POLICIES)?;
    let pb = bar((paths.len() * pols.len()) as u64, json);
    let mut rows = Vec::new();
    for path in paths {
        let trace = load(path)?;
        pb.suspend(|| replay_cmd::warn_trace_issues(&trace.source, &replay_cmd::faults_of_trace(&trace)));
        for p in &pols {
            pb.set_message(format!("{} {}", path.display(), p));
            let opts = ReplayOptions {
                policy: p.clone(),
                config: config.clone(),
                repeats: timing.repeats,
                warm: timing.warm,
                ..ReplayOptions::default()
            };
            rows.push(cudamem_replay::replay(&trace, &opts)?);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if json {
        outln!("{}", Value::Array(rows.iter().map(to_json).collect()));
        return Ok(());
    }
    let names: Vec<String> = rows
        .iter()
        .map(|r| {
            std::path::Path::new(&r.trace)
                .file_name()
                .map_or(r.trace.clone(), |n| n.to_string_lossy().into_owned())
        })
        .collect();
    // The name columns are as wide as their longest entry, so that long trace names keep the
    // columns aligned; each number column is as wide as its header or its widest value.
    let tw = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max("trace".len());
    let pw = rows
        .iter()
        .map(|r| r.policy.chars().count())
        .max()
        .unwrap_or(0)
        .max("policy".len());
    let cells: Vec<[String; 7]> = rows
        .iter()
        .map(|r| {
            let j = to_json(r);
            [
                human(j["peak_requested_bytes"].as_u64().unwrap_or(0)),
                human(j["peak_reserved_bytes"].as_u64().unwrap_or(0)),
                format!("{:.3}", j["reserved_over_requested"].as_f64().unwrap_or(0.0)),
                j["device_allocs"].to_string(),
                (j["device_maps"].as_u64().unwrap_or(0) + j["device_unmaps"].as_u64().unwrap_or(0)).to_string(),
                j["ooms"].to_string(),
                format!("{:.1}", j["replay_ns_per_op"].as_f64().unwrap_or(0.0)),
            ]
        })
        .collect();
    const HEAD: [&str; 7] = [
        "peak req",
        "peak resv",
        "resv/req",
        "dev alloc",
        "maps+unm",
        "OOMs",
        "ns/op",
    ];
    const MIN: [usize; 7] = [12, 12, 9, 9, 8, 6, 8];
    let w: Vec<usize> = (0..7)
        .map(|i| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([HEAD[i].len(), MIN[i]])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |name: &str, policy: &str, nums: &[&str]| {
        let mut l = format!("{name:<tw$} {policy:<pw$}");
        for (n, w) in nums.iter().zip(&w) {
            l.push_str(&format!(" {n:>w$}"));
        }
        l
    };
    outln!("{}", line("trace", "policy", &HEAD));
    for (name, (r, c)) in names.iter().zip(rows.iter().zip(&cells)) {
        let nums: Vec<&str> = c.iter().map(String::as_str).collect();
        outln!("{}", line(name, &r.policy, &nums));
    }
    Ok(())
}

fn cmd_fit(path: &std::path::Path, list: Option<&str>, config: Option<String>, json: bool) -> CliResult {
    let pols = chosen_policies(list, config.as_deref(), &DEFAULT_POLICIES)?;
    let trace = load(path)?;
    replay_cmd::warn_trace_issues(&trace.source, &replay_cmd::faults_of_trace(&trace));
    let pb = bar(pols.len() as u64, json);
    let mut out = Vec::new();
    for p in &pols {
        pb.set_message(p.clone());
        let opts = ReplayOptions {
            policy: p.clone(),
            config: config.clone(),
            ..ReplayOptions::default()
        };
        let cap = cudamem_replay::fit(&trace, &opts)?;
        out.push((p.clone(), cap));
        pb.inc(1);
    }
    pb.finish_and_clear();
    if json {
        let v: Vec<Value> = out
            .iter()
            .map(|(p, c)| json!({"trace": trace.source, "policy": p, "min_capacity_bytes": c}))
            .collect();
        outln!("{}", Value::Array(v));
    } else {
        outln!(
            "smallest simulated GPU on which {} replays without an out-of-memory error:",
            trace.source
        );
        for (p, c) in &out {
            outln!("  {:<20} {:>12}  ({} bytes)", p, human(*c), c);
        }
    }
    Ok(())
}
