//! `COCOON_SIM_TIER`: which cocoon release the simulator answers as. `N` (the default) speaks
//! the newer CLI the daemon is written for; `S` answers as the reference release does, so the
//! daemon's handling of an older host (no `vm exec`/`logs`/`net`/`reconcile-stale-create`, the
//! older clone and run flags, records without the newer fields) can be tested.
//!
//! Tier S keeps the newer verbs and flags in the grammar but hides them from help and refuses
//! them before clap sees the argv, the way cobra would: it parses flags left to right and
//! reports the first one it does not know, and a `vm` word it does not know is no error at
//! all (the `vm` parent has no `Args` check and is not runnable, so cobra prints its help and
//! exits 0).

use std::sync::OnceLock;

use clap::{Command, CommandFactory};

use crate::cli::Cli;
use crate::error::{fail, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The reference release (cocoon @34c6c4a).
    S,
    /// The newer release the daemon targets.
    N,
}

pub const NEWER_VM_VERBS: [&str; 4] = ["exec", "logs", "net", "reconcile-stale-create"];
pub const NEWER_RUN_FLAGS: [&str; 3] = ["cpu-weight", "cpu-quota-us", "cpu-period-us"];
pub const NEWER_CLONE_FLAGS: [&str; 5] = [
    "restore-mode",
    "cpu-weight",
    "cpu-quota-us",
    "cpu-period-us",
    "from-dir",
];

pub fn parse(value: Option<&str>) -> Result<Tier> {
    match value.unwrap_or("") {
        "" | "N" | "n" => Ok(Tier::N),
        "S" | "s" => Ok(Tier::S),
        other => fail(format!("COCOON_SIM_TIER={other:?}: want S or N")),
    }
}

/// Read once: the records a process prints must all be of one tier.
pub fn current() -> Tier {
    static TIER: OnceLock<Tier> = OnceLock::new();
    *TIER.get_or_init(|| parse(std::env::var("COCOON_SIM_TIER").ok().as_deref()).unwrap_or(Tier::N))
}

pub fn check_env() -> Result<()> {
    parse(std::env::var("COCOON_SIM_TIER").ok().as_deref()).map(|_| ())
}

/// The grammar of a tier: in S the newer verbs and flags are hidden, so help lists only what
/// the reference release has.
pub fn command(tier: Tier) -> Command {
    let cli = Cli::command();
    if tier == Tier::N {
        return cli;
    }
    cli.mut_subcommand("vm", |vm| {
        let vm = NEWER_VM_VERBS
            .iter()
            .fold(vm, |vm, verb| vm.mut_subcommand(*verb, |c| c.hide(true)));
        vm.mut_subcommand("run", |c| hide_flags(c, &NEWER_RUN_FLAGS))
            .mut_subcommand("clone", |c| hide_flags(c, &NEWER_CLONE_FLAGS))
    })
}

fn hide_flags(mut cmd: Command, longs: &[&str]) -> Command {
    for long in longs {
        let id = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(*long))
            .map(|a| a.get_id().clone())
            .unwrap_or_else(|| panic!("--{long} is in the grammar"));
        cmd = cmd.mut_arg(id, |a| a.hide(true));
    }
    cmd
}

/// What tier S answers before clap parses the argv.
#[derive(Debug, PartialEq, Eq)]
pub enum Screened {
    /// cobra's "unknown flag: --x" / "unknown shorthand flag: 'x' in -x".
    UnknownFlag(String),
    /// A parent (`vm`, `snapshot`, `image`) with no word or an unknown one: its help on
    /// stdout, exit 0.
    Help(String),
}

/// cobra's parent commands: not runnable and without an argument check, so a word under them
/// that names no child is no error.
const PARENTS: [&str; 3] = ["vm", "snapshot", "image"];

/// The flags a command level knows: `(long, short, takes a value)`.
struct Known(Vec<(String, Option<char>, bool)>);

impl Known {
    fn of(cmd: &Command, globals: &[(String, Option<char>, bool)]) -> Known {
        let mut v: Vec<_> = globals.to_vec();
        for a in cmd.get_arguments() {
            if let Some(long) = a.get_long() {
                v.push((
                    long.to_string(),
                    a.get_short(),
                    a.get_action().takes_values(),
                ));
            }
        }
        v.push(("help".into(), Some('h'), false));
        Known(v)
    }

    fn long(&self, name: &str) -> Option<bool> {
        self.0.iter().find(|f| f.0 == name).map(|f| f.2)
    }

    fn short(&self, c: char) -> Option<bool> {
        self.0.iter().find(|f| f.1 == Some(c)).map(|f| f.2)
    }
}

/// A flag token as pflag reads it: `Some(Err(text))` for an unknown one, `Some(Ok(skip))`
/// for a known one (`skip` = its value is the next token), `None` for a non-flag word.
fn flag_token(
    tok: &str,
    known: &Known,
    refused: &[&str],
) -> Option<std::result::Result<bool, String>> {
    if let Some(body) = tok.strip_prefix("--") {
        let (name, inline) = match body.split_once('=') {
            Some((n, _)) => (n, true),
            None => (body, false),
        };
        if refused.contains(&name) {
            return Some(Err(format!("unknown flag: --{name}")));
        }
        return Some(match known.long(name) {
            Some(takes) => Ok(takes && !inline),
            None => Err(format!("unknown flag: --{name}")),
        });
    }
    let short = tok.strip_prefix('-').filter(|s| !s.is_empty())?;
    let c = short.chars().next()?;
    Some(match known.short(c) {
        Some(takes) => Ok(takes && short.len() == c.len_utf8()),
        None => Err(format!("unknown shorthand flag: '{c}' in {tok}")),
    })
}

/// Tier S's answer to an argv that names no child of a parent (a newer `vm` verb, say) or a
/// newer run/clone flag; `None` when clap's parse of the tier's grammar gives the right answer.
pub fn screen(cmd: &Command, argv: &[String]) -> Option<Screened> {
    let globals: Vec<_> = cmd
        .get_arguments()
        .filter_map(|a| {
            a.get_long()
                .map(|l| (l.to_string(), a.get_short(), a.get_action().takes_values()))
        })
        .collect();
    let root = Known::of(&Command::new("cocoon"), &globals);
    let mut rest = argv.iter().skip(1);
    let Word::Found(parent_name) = next_word(&mut rest, &root) else {
        return None;
    };
    if !PARENTS.contains(&parent_name.as_str()) {
        return None;
    }
    let parent = cmd.find_subcommand(&parent_name)?;
    let parent_known = Known::of(&Command::new("parent"), &globals);
    let after_parent: Vec<&String> = rest.collect();
    let mut words = after_parent.iter().copied();
    // cobra parses the parent's flags over everything after it before it gives up on the word.
    let help = || {
        Some(
            first_unknown(&after_parent, &parent_known, &[])
                .unwrap_or(Screened::Help(parent_name.clone())),
        )
    };
    let verb = match next_word(&mut words, &parent_known) {
        Word::Unknown => return None,
        Word::End => return help(),
        Word::Found(w) => w,
    };
    let Some(sub) = parent.find_subcommand(&verb).filter(|c| !c.is_hide_set()) else {
        return help();
    };
    let refused: &[&str] = match (parent_name.as_str(), verb.as_str()) {
        ("vm", "run") => &NEWER_RUN_FLAGS,
        ("vm", "clone") => &NEWER_CLONE_FLAGS,
        _ => return None,
    };
    let remaining: Vec<&String> = words.collect();
    let known = Known::of(sub, &globals);
    match first_unknown(&remaining, &known, refused)? {
        // A flag unknown to both tiers is clap's to report, in cobra's words.
        Screened::UnknownFlag(t) if refused.iter().any(|r| t == format!("unknown flag: --{r}")) => {
            Some(Screened::UnknownFlag(t))
        }
        _ => None,
    }
}

enum Word {
    Found(String),
    /// The end of the argv, or `--`.
    End,
    /// A flag this level does not know: clap reports it.
    Unknown,
}

/// The next non-flag word, skipping known flags and their values.
fn next_word<'a>(it: &mut impl Iterator<Item = &'a String>, known: &Known) -> Word {
    while let Some(tok) = it.next() {
        if tok == "--" {
            return Word::End;
        }
        match flag_token(tok, known, &[]) {
            None => return Word::Found(tok.clone()),
            Some(Ok(true)) => {
                it.next();
            }
            Some(Ok(false)) => {}
            Some(Err(_)) => return Word::Unknown,
        }
    }
    Word::End
}

fn first_unknown(tokens: &[&String], known: &Known, refused: &[&str]) -> Option<Screened> {
    let mut it = tokens.iter();
    while let Some(tok) = it.next() {
        if tok.as_str() == "--" {
            return None;
        }
        match flag_token(tok, known, refused) {
            Some(Err(text)) => return Some(Screened::UnknownFlag(text)),
            Some(Ok(true)) => {
                it.next();
            }
            _ => {}
        }
    }
    None
}
