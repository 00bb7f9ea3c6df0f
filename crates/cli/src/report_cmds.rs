//! `cudamem summary | leaks | why | viz`: the reports of `cudamem-report` on the command line.
//! Each subcommand reads one trace, calls one function of the library, and prints its text or
//! JSON rendering; errors name the file.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use cudamem_report::{leaks, summary, viz, viz_replay, why, At};

use crate::files::{self, load, Output};

/// The report subcommands (flattened into the top-level command list).
#[derive(Subcommand)]
pub enum ReportCommand {
    /// Print PyTorch's memory_summary() table for a trace, at its end and at its reserved peak
    /// (the trace replayed with the recorded allocator: policy pytorch, the trace's settings).
    Summary {
        /// The snapshot or trace file (.pickle, .pickle.gz, RMM .csv, cudamem .cmt).
        trace: PathBuf,
        /// Print one JSON object instead.
        #[arg(long)]
        json: bool,
    },
    /// List the allocations still live at the end of a trace (or at a marked point), grouped by
    /// the stack that allocated them, largest first.
    Leaks {
        /// The snapshot or trace file.
        trace: PathBuf,
        /// An event index (0 or more: the state just after it), or an annotation name: NAME,
        /// NAME@k (k-th occurrence) or NAME@last.
        // Hyphen values reach `at_value`, which says what is wrong with a negative index.
        #[arg(long, allow_hyphen_values = true, value_parser = at_value)]
        at: Option<String>,
        /// How many call sites to print.
        #[arg(long, default_value_t = 10, allow_hyphen_values = true, value_parser = crate::whole::<usize>)]
        top: usize,
        /// Frames printed per call site.
        #[arg(long, default_value_t = 12, allow_hyphen_values = true, value_parser = crate::whole::<usize>)]
        frames: usize,
        /// Print one JSON object with every group instead.
        #[arg(long)]
        json: bool,
    },
    /// Explain the reserved-but-unallocated memory at the end of a snapshot: what empty_cache()
    /// would release now, and which live blocks pin the rest.
    Why {
        /// The snapshot (a trace without segments is replayed to find the final state).
        trace: PathBuf,
        /// How many pinned segments to print.
        #[arg(long, default_value_t = 10, allow_hyphen_values = true, value_parser = crate::whole::<usize>)]
        top: usize,
        /// Print one JSON object with every segment instead.
        #[arg(long)]
        json: bool,
    },
    /// Write one self-contained HTML file (no network access) to explore a trace: active-memory
    /// timeline, segment map at any event, reserved vs allocated, memory_summary().
    Viz {
        /// The snapshot or trace file.
        trace: PathBuf,
        /// Output HTML file (`-`: stdout); never one of the inputs.
        #[arg(short = 'o', long = "output", default_value = "report.html")]
        output: PathBuf,
        /// Show the replay of this policy instead of the recorded allocator.
        #[arg(long, help = crate::policy_help("Show the replay of this policy instead of the recorded allocator", false))]
        policy: Option<String>,
        /// Allocator settings over the trace's own for --policy (PYTORCH_CUDA_ALLOC_CONF syntax).
        #[arg(long, requires = "policy")]
        config: Option<String>,
        /// Page title (default: the trace's file name).
        #[arg(long)]
        title: Option<String>,
    },
}

/// `leaks --at`: a negative number is refused (an event index is 0 or more) instead of being
/// read as an option or as an annotation name.
fn at_value(s: &str) -> Result<String, String> {
    let t = s.trim();
    if let Some(n) = t.strip_prefix('-') {
        if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit() || c == b'.') {
            return Err(format!(
                "an event index is 0 or more (0 is the first event), not {t}; an annotation is given by its name"
            ));
        }
    }
    Ok(s.to_string())
}

/// Prefixes an error with the trace's file name unless it already names it.
fn named(path: &Path, e: String) -> String {
    let name = path
        .file_name()
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    if e.starts_with(&name) {
        e
    } else {
        format!("{name}: {e}")
    }
}

fn json_out(v: serde_json::Value) -> crate::CliResult {
    outln!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    Ok(())
}

/// Runs one report subcommand.
pub fn run(cmd: ReportCommand) -> crate::CliResult {
    match cmd {
        ReportCommand::Summary { trace, json } => {
            let t = load(&trace)?;
            let r = summary(&t).map_err(|e| named(&trace, e))?;
            if json {
                return json_out(r.to_json());
            }
            out!("{r}");
            Ok(())
        }
        ReportCommand::Leaks {
            trace,
            at,
            top,
            frames,
            json,
        } => {
            let t = load(&trace)?;
            let at = at.as_deref().map_or(At::End, At::parse);
            let r = leaks(&t, &at).map_err(|e| named(&trace, e))?;
            if json {
                return json_out(r.to_json());
            }
            out!("{}", r.to_text(top, frames));
            Ok(())
        }
        ReportCommand::Why { trace, top, json } => {
            let t = load(&trace)?;
            let r = why(&t).map_err(|e| named(&trace, e))?;
            if json {
                return json_out(r.to_json());
            }
            out!("{}", r.to_text(top, 5, 6));
            outln!("what a larger batch needs, and the largest that fits a GPU: `cudamem scale` (docs/guide/will-it-fit.md)");
            Ok(())
        }
        ReportCommand::Viz {
            trace,
            output,
            policy,
            config,
            title,
        } => {
            let output = files::output("-o", &output, std::slice::from_ref(&trace))?;
            let t = load(&trace)?;
            let title = title.unwrap_or_else(|| match &policy {
                Some(p) => format!("{} replayed with {p}", t.source),
                None => t.source.clone(),
            });
            let html = match &policy {
                Some(p) => {
                    let mut cfg = cudamem_alloc::AllocatorConfig::default();
                    cudamem_alloc::policy::by_name(p, &mut cfg)?;
                    viz_replay(&t, p, config, &title).map_err(|e| named(&trace, e))?
                }
                None => viz(&t, &title),
            };
            match &output {
                Output::Stdout => out!("{html}"),
                Output::File(p) => {
                    std::fs::write(p, html.as_bytes()).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
                    eprintln!("wrote {} ({} KiB)", p.display(), html.len().div_ceil(1024));
                }
            }
            Ok(())
        }
    }
}
