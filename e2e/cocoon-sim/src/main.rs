//! `cocoon` — a simulator of the cocoon MicroVM CLI for vk-cocoon's tests. See README.md.

mod archive;
mod cgroup;
mod cleanup;
mod cli;
mod config;
mod disk;
mod error;
mod events;
mod faults;
mod fixup;
mod guest;
#[cfg(test)]
mod help_probe;
mod hub;
mod ids;
mod images;
mod ipam;
mod leases;
mod lock;
mod macos;
mod model;
mod names;
mod net_control;
mod netns;
mod output;
mod sac;
mod sim;
mod snapshot;
mod sparse;
mod store;
mod tier;
mod timefmt;
mod vm;
mod vm_ops;
mod vmnet;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{FromArgMatches, Parser};

use cli::{Cli, Cmd};
use error::{Error, Result};

/// Cobra's wording for argv mistakes, so clients that substring-match see cocoon's texts.
fn cobra_text(e: &clap::Error, argv: &[String]) -> String {
    let ctx = |k: ContextKind| match e.get(k) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.first().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    match e.kind() {
        ErrorKind::UnknownArgument => {
            let arg = ctx(ContextKind::InvalidArg);
            let flag = arg.split('=').next().unwrap_or(&arg).to_string();
            if let Some(short) = flag.strip_prefix('-').filter(|s| !s.starts_with('-')) {
                let c = short.chars().next().unwrap_or('?');
                format!("unknown shorthand flag: '{c}' in {flag}")
            } else if flag.starts_with("--") {
                format!("unknown flag: {flag}")
            } else {
                format!(
                    "unknown command {flag:?} for \"{}\"",
                    parent_path(argv, &flag)
                )
            }
        }
        ErrorKind::InvalidSubcommand => {
            let sub = ctx(ContextKind::InvalidSubcommand);
            format!(
                "unknown command {sub:?} for \"{}\"",
                parent_path(argv, &sub)
            )
        }
        ErrorKind::InvalidValue | ErrorKind::ValueValidation => {
            let arg = ctx(ContextKind::InvalidArg);
            let flag = arg.split_whitespace().next().unwrap_or(&arg).to_string();
            let value = ctx(ContextKind::InvalidValue);
            if value.is_empty() {
                format!("flag needs an argument: {flag}")
            } else {
                format!("invalid argument {value:?} for {flag:?} flag: strconv.ParseInt: parsing {value:?}: invalid syntax")
            }
        }
        _ => e
            .to_string()
            .lines()
            .next()
            .unwrap_or("usage error")
            .trim_start_matches("error: ")
            .to_string(),
    }
}

/// "cocoon vm" for `cocoon vm frobnicate`: the words before the unknown one, flags skipped.
fn parent_path(argv: &[String], unknown: &str) -> String {
    let mut words = vec!["cocoon".to_string()];
    for a in argv.iter().skip(1) {
        if a == unknown {
            break;
        }
        if !a.starts_with('-') {
            words.push(a.clone());
        }
    }
    words.join(" ")
}

fn dispatch(cli: Cli) -> Result<()> {
    let flags = config::DirFlags {
        root_dir: cli.global.root_dir.clone(),
        run_dir: cli.global.run_dir.clone(),
        log_dir: cli.global.log_dir.clone(),
    };
    let Some(cmd) = cli.cmd else {
        return Err(Error::Exit(help_and_exit()));
    };
    if let Cmd::Sim(cli::SimCmd::Guest { id, control }) = &cmd {
        return guest::run(id, std::path::Path::new(control));
    }
    if let Cmd::Sim(cli::SimCmd::Hub { root }) = &cmd {
        return hub::run(std::path::Path::new(root));
    }
    let env = config::Env::load(&flags)?;
    match cmd {
        Cmd::Vm(c) => vm::dispatch(&env, c),
        Cmd::Snapshot(c) => snapshot::dispatch(&env, c),
        Cmd::Image(c) => images::dispatch(&env, c),
        Cmd::Sim(c) => sim::dispatch(&env, c),
    }
}

fn help_and_exit() -> i32 {
    let _ = tier::command(tier::current()).print_help();
    0
}

fn parse_error(e: clap::Error, argv: &[String], binary: &str) -> ! {
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        | ErrorKind::MissingSubcommand => {
            let _ = e.print();
            std::process::exit(0);
        }
        _ => {
            let text = cobra_text(&e, argv).replace("\"cocoon", &format!("\"{binary}"));
            eprintln!("Error: {text}");
            // The reference release's cobra follows a root-level unknown command with a hint.
            let root_level = text.ends_with(&format!("for \"{binary}\""));
            if binary == "cocoon" && root_level && tier::current() == tier::Tier::S {
                eprintln!("Run 'cocoon --help' for usage.");
            }
            std::process::exit(1);
        }
    }
}

fn finish(r: Result<()>) {
    match r {
        Ok(()) => {}
        Err(Error::Exit(code)) => std::process::exit(code),
        Err(Error::Msg(m)) => {
            eprintln!("Error: {m}");
            std::process::exit(1);
        }
    }
}

/// cocoon-macos: its own grammar over the shared machinery.
fn main_macos(argv: &[String]) {
    let cli = match macos::MacCli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => parse_error(e, argv, macos::NAME),
    };
    let flags = config::DirFlags {
        root_dir: cli.root_dir.clone(),
        ..Default::default()
    };
    finish(config::Env::load(&flags).and_then(|env| macos::dispatch(&env, cli)));
}

fn main() {
    let mut argv: Vec<String> = std::env::args().collect();
    if macos::personality(&mut argv) {
        return main_macos(&argv);
    }
    if let Err(e) = tier::check_env() {
        finish(Err(e));
    }
    let tier = tier::current();
    let mut grammar = tier::command(tier);
    if tier == tier::Tier::S {
        match tier::screen(&grammar, &argv) {
            Some(tier::Screened::UnknownFlag(text)) => finish(error::fail(text)),
            Some(tier::Screened::Help(parent)) => {
                let help = grammar.try_get_matches_from_mut(["cocoon", &parent, "--help"]);
                parse_error(help.expect_err("--help ends the parse"), &argv, "cocoon")
            }
            None => {}
        }
    }
    let cli = match grammar
        .try_get_matches_from_mut(&argv)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(c) => c,
        Err(e) => parse_error(e, &argv, "cocoon"),
    };
    finish(dispatch(cli));
}

/// Cobra's positional-count checks.
pub fn exact_args(args: &[String], n: usize) -> Result<()> {
    if args.len() != n {
        return error::fail(format!("accepts {n} arg(s), received {}", args.len()));
    }
    Ok(())
}

pub fn min_args(args: &[String], n: usize) -> Result<()> {
    if args.len() < n {
        return error::fail(format!(
            "requires at least {n} arg(s), only received {}",
            args.len()
        ));
    }
    Ok(())
}
