//! `oci-image`: the daemon's OCI image from its static binary, without a container engine.
//! `make image` runs it on the stripped musl build; see packaging/README.md.

mod layout;
mod push;

use anyhow::{bail, Context, Result};
use clap::Parser;
use layout::{Image, Inputs};
use std::path::PathBuf;

/// The reference the image is filed under on import, and the one packaging/daemonset.yaml runs.
pub fn default_reference() -> String {
    format!("localhost/vk-cocoon:{}", env!("CARGO_PKG_VERSION"))
}

#[derive(Parser)]
#[command(about = "Builds the vk-cocoon OCI image from a static binary (no container engine)")]
struct Args {
    /// The daemon, statically linked (make dist builds it).
    #[arg(long)]
    binary: PathBuf,
    /// PEM bundle the image's registry client trusts.
    #[arg(long, default_value = "/etc/ssl/certs/ca-certificates.crt")]
    ca_bundle: PathBuf,
    /// The reference a runtime files the image under on import.
    #[arg(long, default_value_t = default_reference())]
    reference: String,
    /// Where the OCI layout archive goes.
    #[arg(long)]
    out: PathBuf,
    /// Also push to this reference (REGISTRY_USERNAME and REGISTRY_PASSWORD, when set, log in).
    #[arg(long)]
    push: Option<String>,
    /// Push over plain HTTP (a loopback registry without TLS).
    #[arg(long)]
    insecure: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let binary = std::fs::read(&args.binary)
        .with_context(|| format!("reading {}", args.binary.display()))?;
    if let Some(interp) = elf_interpreter(&binary)? {
        bail!(
            "{} is linked dynamically (it asks for {interp}); the image has no libc: build the \
             static binary with `make dist`",
            args.binary.display()
        );
    }
    let ca_bundle = std::fs::read(&args.ca_bundle).with_context(|| {
        format!(
            "reading the CA bundle {} (Debian's ca-certificates package)",
            args.ca_bundle.display()
        )
    })?;
    let version = env!("CARGO_PKG_VERSION");
    let image = Image::build(&Inputs {
        binary: &binary,
        ca_bundle: Some(&ca_bundle),
        version,
        reference: &args.reference,
    })?;
    let archive = image.layout_archive()?;
    if let Some(dir) = args.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.out, &archive)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "image {} ({version}): manifest {}, layer {:.1} MiB; OCI archive {}",
        args.reference,
        image.manifest.digest,
        image.layer.bytes.len() as f64 / (1 << 20) as f64,
        args.out.display()
    );
    if let Some(target) = &args.push {
        rustls::crypto::ring::default_provider()
            .install_default()
            .ok();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let url = runtime.block_on(push::push(&image, target, args.insecure))?;
        println!("pushed {target} ({url})");
    }
    Ok(())
}

/// The program interpreter an ELF64 file asks for (PT_INTERP), `None` for a static binary.
fn elf_interpreter(elf: &[u8]) -> Result<Option<String>> {
    const PT_INTERP: u32 = 3;
    if elf.get(..5) != Some(b"\x7fELF\x02") {
        bail!("not a 64-bit ELF file");
    }
    let u16_at = |o: usize| {
        elf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize)
    };
    let truncated = || anyhow::anyhow!("truncated ELF header");
    let (phoff, phentsize, phnum) = (
        u64_at(0x20).ok_or_else(truncated)?,
        u16_at(0x36).ok_or_else(truncated)?,
        u16_at(0x38).ok_or_else(truncated)?,
    );
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if u32_at(ph).ok_or_else(truncated)? == PT_INTERP {
            let (off, size) = (
                u64_at(ph + 8).ok_or_else(truncated)?,
                u64_at(ph + 32).ok_or_else(truncated)?,
            );
            let path = elf.get(off..off + size).ok_or_else(truncated)?;
            return Ok(Some(
                String::from_utf8_lossy(path)
                    .trim_end_matches('\0')
                    .to_string(),
            ));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_is_told_apart_from_a_static_one() {
        // This test binary itself is linked against glibc.
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let interp = elf_interpreter(&me).unwrap();
        assert!(interp.is_some_and(|i| i.contains("ld-linux")));
        assert!(elf_interpreter(b"#!/bin/sh\n").is_err());
        assert!(elf_interpreter(b"\x7fELF\x02\x01").is_err());
    }
}
