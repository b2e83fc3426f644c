//! What this node's cocoon can do (CLI-10), read once at startup from the binary's own help:
//! `vm --help` lists its subcommands, `vm run --help` and `vm clone --help` their flags. Help
//! is what an older cocoon answers to a verb it lacks, with exit 0, so the verbs cannot be
//! probed by calling them.

use reconcilers::cocoon_caps::CocoonCaps;

use super::CocoonCli;

/// The subcommands a help text lists: the first word of each indented line under a heading
/// that ends in `Commands:` (cobra's `Available Commands:` and groups, clap's `Commands:`).
pub fn subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut listing = false;
    for line in help.lines() {
        if line.trim_end().ends_with("Commands:") {
            listing = true;
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if !indented || line.trim().is_empty() {
            listing = false;
            continue;
        }
        if listing {
            if let Some(word) = line.split_whitespace().next() {
                out.push(word.to_string());
            }
        }
    }
    out
}

/// Whether a help text names the long flag `name` (as `--name`, ended by anything that cannot
/// continue a flag name, so `--cpu` is not found in `--cpu-weight`).
pub fn has_flag(help: &str, name: &str) -> bool {
    let needle = format!("--{name}");
    help.match_indices(&needle).any(|(at, _)| {
        let before_ok = help[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-'));
        let after_ok = help[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        before_ok && after_ok
    })
}

/// The capabilities the three help texts show; `None` when they do not look like cocoon's
/// (no `run` or `clone` subcommand), so a wrapper that prints something else is not read as
/// a cocoon that can do nothing.
pub fn parse(vm_help: &str, run_help: &str, clone_help: &str) -> Option<CocoonCaps> {
    let subs = subcommands(vm_help);
    let has = |v: &str| subs.iter().any(|s| s == v);
    if !has("run") || !has("clone") {
        return None;
    }
    Some(CocoonCaps {
        exec: has("exec"),
        logs: has("logs"),
        net: has("net"),
        reconcile_stale_create: has("reconcile-stale-create"),
        clone_from_dir: has_flag(clone_help, "from-dir"),
        restore_mode: has_flag(clone_help, "restore-mode"),
        cpu_knobs: has_flag(run_help, "cpu-weight") && has_flag(clone_help, "cpu-weight"),
    })
}

/// Runs the three help commands. A cocoon that cannot answer them is assumed current, with a
/// warning: every call it is asked to make will then fail with its own error.
pub async fn detect(cli: &CocoonCli) -> CocoonCaps {
    let help = |args: &'static [&'static str]| {
        let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move { cli.run(&argv).await }
    };
    let (vm, run, clone) = tokio::join!(
        help(&["vm", "--help"]),
        help(&["vm", "run", "--help"]),
        help(&["vm", "clone", "--help"])
    );
    let texts = match (vm, run, clone) {
        (Ok(vm), Ok(run), Ok(clone)) => (vm, run, clone),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            tracing::warn!(bin = %cli.bin, error = %e.message,
                "cannot read cocoon's help to learn what it supports; assuming a current cocoon");
            return CocoonCaps::CURRENT;
        }
    };
    match parse(&texts.0, &texts.1, &texts.2) {
        Some(caps) => {
            match caps.is_current() {
                true => tracing::info!(bin = %cli.bin, "cocoon supports every verb vk uses"),
                false => tracing::warn!(bin = %cli.bin, missing = %caps.describe_missing(),
                    "cocoon is an older release: what needs the missing verbs is refused with a \
                     message naming them"),
            }
            caps
        }
        None => {
            tracing::warn!(bin = %cli.bin,
                "cocoon's `vm --help` lists no run or clone subcommand; assuming a current cocoon");
            CocoonCaps::CURRENT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cobra's layout, as the reference release prints it.
    const COBRA_VM: &str = "Manage virtual machines\n\nUsage:\n  cocoon vm [command]\n\n\
        Available Commands:\n  clone       Clone a VM from a snapshot\n  console     Attach\n  \
        create      Create a VM\n  inspect     Show\n  list        List VMs\n  rm          Remove\n  \
        run         Create and start a VM\n  start       Start\n  status      Watch\n  stop        Stop\n\n\
        Flags:\n  -h, --help   help for vm\n\nGlobal Flags:\n      --root-dir string   root\n\n\
        Use \"cocoon vm [command] --help\" for more information about a command.\n";

    /// clap's layout, as the simulator prints it.
    const CLAP_VM: &str = "VM commands\n\nUsage: cocoon vm <COMMAND>\n\nCommands:\n  run     Boot\n  \
        clone   Clone\n  exec    Run in the guest\n  logs    Log\n  net     NICs\n  \
        reconcile-stale-create  Placeholders\n  help    Print this message\n\nOptions:\n  -h, --help  Print help\n";

    #[test]
    fn subcommands_are_read_from_cobra_and_clap_layouts() {
        let cobra = subcommands(COBRA_VM);
        assert!(cobra.contains(&"run".to_string()) && cobra.contains(&"clone".to_string()));
        assert!(!cobra.contains(&"exec".to_string()));
        assert!(!cobra.iter().any(|s| s.starts_with('-')), "{cobra:?}");
        let clap = subcommands(CLAP_VM);
        for v in [
            "run",
            "clone",
            "exec",
            "logs",
            "net",
            "reconcile-stale-create",
        ] {
            assert!(clap.contains(&v.to_string()), "{v} in {clap:?}");
        }
    }

    #[test]
    fn a_flag_is_found_whole() {
        let help = "      --cpu int          boot CPUs\n      --cpu-weight int   weight\n";
        assert!(has_flag(help, "cpu"));
        assert!(has_flag(help, "cpu-weight"));
        assert!(!has_flag(help, "cpu-quota-us"));
        assert!(!has_flag("      --cpu-weight int\n", "cpu"));
        assert!(has_flag("  --restore-mode <MODE>", "restore-mode"));
    }

    /// The reference release's own help, captured from the binary `make deps` builds.
    #[test]
    fn the_reference_release_lacks_the_newer_verbs_and_flags() {
        let vm = include_str!("../../tests/fixtures/cocoon-reference-help/vm.txt");
        let run = include_str!("../../tests/fixtures/cocoon-reference-help/vm-run.txt");
        let clone = include_str!("../../tests/fixtures/cocoon-reference-help/vm-clone.txt");
        assert_eq!(parse(vm, run, clone), Some(CocoonCaps::REFERENCE));
        assert_eq!(parse(COBRA_VM, "", ""), Some(CocoonCaps::REFERENCE));
    }

    #[test]
    fn a_current_cocoon_has_everything() {
        let run = "  --cpu-weight <W>\n  --cpu-quota-us <Q>\n";
        let clone = "  --restore-mode <M>\n  --from-dir <DIR>\n  --cpu-weight <W>\n";
        assert_eq!(parse(CLAP_VM, run, clone), Some(CocoonCaps::CURRENT));
    }

    #[test]
    fn help_that_is_not_cocoons_is_not_read_as_a_cocoon_without_verbs() {
        assert_eq!(parse("usage: wrapper [args]\n", "", ""), None);
    }
}
