//! The rule the daemon uses to learn a host's cocoon tier from three help texts (`vm --help`,
//! `vm run --help`, `vm clone --help`). Kept apart from its tests so the differential suite
//! (e2e/tests/cocoon_differential.rs) applies the very same rule to the live real CLI.
//!
//! A verb is present when its name is the first word of an indented line in a section headed
//! by a line ending in `Commands:` (cobra: `Available Commands:`, clap: `Commands:`); the
//! section ends at the first blank or unindented line. A flag is present when `--name` is a
//! whole token of the text, tokens being runs of ASCII letters, digits and `-`, so `--cpu`
//! is not found inside `--cpu-weight`.

pub fn verbs(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_section = false;
    for line in help.lines() {
        if line.trim_end().ends_with("Commands:") {
            in_section = true;
            continue;
        }
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if !in_section || line.trim().is_empty() || !indented {
            in_section = false;
            continue;
        }
        if let Some(word) = line.split_whitespace().next() {
            out.push(word.to_string());
        }
    }
    out
}

pub fn has_flag(help: &str, flag: &str) -> bool {
    help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .any(|tok| tok == flag)
}
