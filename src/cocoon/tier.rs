//! What this node's cocoon can do (CLI-10), read once at startup from the binary's own help:
//! `vm --help` lists its subcommands, `vm run --help` and `vm clone --help` their flags (read by
//! `CocoonCaps::from_help`). Help is what an older cocoon answers to a verb it lacks, with exit
//! 0, so the verbs cannot be probed by calling them.

use reconcilers::cocoon_caps::CocoonCaps;

use super::CocoonCli;

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
    match CocoonCaps::from_help(&texts.0, &texts.1, &texts.2) {
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
