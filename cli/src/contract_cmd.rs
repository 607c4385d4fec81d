//! `ichor contract derive`: a Talos contract's path inventory, from its JSON schema.
//!
//! Adding the next Talos contract is: run this on its `config.schema.json`, commit the output
//! as `rules/contracts/vX.Y.paths`, add rules, run `ichor rules check`.

use crate::Report;
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand, Debug)]
pub enum ContractCommand {
    /// Print (or write) the path inventory of a Talos machine-config schema.
    #[command(
        after_help = "Example:\n  ichor contract derive --schema config.schema.v1.14.json --contract v1.14 --out rules/contracts/v1.14.paths"
    )]
    Derive {
        /// Talos's config.schema.json for that contract.
        #[arg(long)]
        schema: PathBuf,
        /// The contract's name, vX.Y.
        #[arg(long)]
        contract: String,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Corrections to the schema (kinds renamed, paths it leaves out).
        #[arg(long, default_value = "rules/contracts/corrections.yaml")]
        corrections: PathBuf,
    },
}

pub fn run(cmd: ContractCommand) -> Result<Report> {
    match cmd {
        ContractCommand::Derive { schema, contract, out, corrections } => {
            if !regex_lite_contract(&contract) {
                bail!("contract {contract:?} is not of the form vX.Y (for example v1.14)");
            }
            let text = crate::disk::read_text(&schema, crate::disk::caps::FACTS, "a config schema")?;
            let ctext = crate::disk::read_text(&corrections, crate::disk::caps::TEXT, "schema corrections")?;
            let fixes =
                render::inventory::parse_corrections(&ctext).with_context(|| corrections.display().to_string())?;
            let inv =
                render::inventory::derive(&text, &contract, &fixes).with_context(|| schema.display().to_string())?;
            match out {
                Some(path) => {
                    std::fs::write(&path, &inv).with_context(|| format!("writing {}", path.display()))?;
                    let n = inv.lines().filter(|l| !l.starts_with('#')).count();
                    Ok(Report { stdout: format!("wrote {} ({n} paths)\n", path.display()), ..Report::default() })
                }
                None => Ok(Report { stdout: inv, ..Report::default() }),
            }
        }
    }
}

fn regex_lite_contract(c: &str) -> bool {
    let Some(rest) = c.strip_prefix('v') else {
        return false;
    };
    let mut parts = rest.split('.');
    let ok = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}
