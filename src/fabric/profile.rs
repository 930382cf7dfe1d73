//! Calibration profiles on disk: a TOML file whose `[params]` table overrides model
//! parameters (the same keys as `src/fabric/params.toml`, and `[params.compute]` for the
//! training compute model's constants). This module reads the file and
//! checks every key and value against the model parameters, with errors at the profile's
//! line; the fabric builder applies them.
//!
//! Architecture invariant: knows TOML, file paths and the parameters' names and ranges,
//! nothing of scenarios or of how the parameters are used.

use std::ops::Range;
use std::path::Path;

use toml::de::{DeTable, DeValue};

use super::file::line_col;
use super::params::ComputeOverrides;
use super::{Generation, ModelParams};

/// A calibration profile that cannot be used.
pub type ProfileError = crate::fabric::file::FileError;

/// Reads a calibration profile and returns its `[params]` table.
pub fn load_profile(path: &Path) -> Result<toml::Table, ProfileError> {
    let file = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| ProfileError::Io { file: file.clone(), source })?;
    parse_profile(&text, &file)
}

/// Parses profile text (`file` names it in messages). Every key and value is checked here,
/// against the parameters of `src/fabric/params.toml`, so that a typo is reported at its
/// line in the profile, not later against a topology or as a point "rejected by the model".
pub fn parse_profile(text: &str, file: &str) -> Result<toml::Table, ProfileError> {
    let at = |span: Range<usize>, msg: String| {
        let (line, col) = line_col(text, span.start);
        ProfileError::At { file: file.to_string(), line, col, msg }
    };
    let doc = DeTable::parse(text).map_err(|e| match e.span() {
        Some(s) => at(s, e.message().to_string()),
        None => ProfileError::Invalid { file: file.to_string(), msg: e.message().to_string() },
    })?;
    let Some((key, value)) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == "params") else {
        return Err(ProfileError::Invalid {
            file: file.to_string(),
            msg: "a calibration profile needs a [params] table (same keys as fabric/params.toml)".into(),
        });
    };
    let DeValue::Table(user) = value.get_ref() else {
        return Err(at(key.span(), "`params` must be a table".into()));
    };
    // `[calibration]` is what `fabricsim calibrate` says about the fit (inputs, residuals,
    // confidence): metadata, accepted and not read.
    let known_top = |k: &str| k == "params" || k == "calibration";
    if let Some((k, _)) = doc.get_ref().iter().find(|(k, _)| !known_top(k.get_ref())) {
        return Err(at(
            k.span(),
            format!(
                "unknown key `{}`; a calibration profile holds a [params] table and an optional \
                 [calibration] table of metadata",
                k.get_ref()
            ),
        ));
    }
    // Values the span parser leaves as text (an overflowing float) fail here: at their line.
    let t: toml::Table = toml::from_str(text).map_err(|e| match e.span() {
        Some(s) => at(s, e.message().to_string()),
        None => ProfileError::Invalid { file: file.to_string(), msg: e.message().to_string() },
    })?;
    match t.get("params") {
        Some(toml::Value::Table(params)) => check_params(text, file, user, params).map(|()| params.clone()),
        _ => Err(at(key.span(), "`params` must be a table".into())),
    }
}

/// Checks a `[params]` table (`params`, and `user`, the same parsed with spans from `text`, the
/// file `file`): every key against the model parameters (a typo is reported at its line with
/// the valid keys there) and every value against their ranges (at the value's line).
pub(crate) fn check_params(
    text: &str,
    file: &str,
    user: &DeTable<'_>,
    params: &toml::Table,
) -> Result<(), ProfileError> {
    let at = |span: Range<usize>, msg: String| {
        let (line, col) = line_col(text, span.start);
        ProfileError::At { file: file.to_string(), line, col, msg }
    };
    // Any generation's defaults name every key; the values are checked on top of them.
    let defaults = ModelParams::for_generation(Generation::Hopper);
    let mut known = toml::Table::try_from(&defaults)
        .map_err(|e| ProfileError::Invalid { file: file.to_string(), msg: e.to_string() })?;
    // The compute model's constants are absent from the defaults (they live in
    // workload/gpu_params.toml): a profile may set any of them.
    let compute = ComputeOverrides::KEYS.iter().map(|k| (k.to_string(), toml::Value::Float(0.0)));
    known.insert("compute".into(), toml::Value::Table(compute.collect()));
    let mut leaves = Vec::new();
    check_keys(&known, user, "", &mut leaves).map_err(|(span, msg)| at(span, msg))?;
    if let Err(e) = defaults.overlay(params) {
        let msg = format!("[params]: {e}");
        // Point at the value the message names (the longest key path it mentions).
        return Err(
            match leaves.iter().filter(|(path, _)| msg.contains(path.as_str())).max_by_key(|l| l.0.len()) {
                Some((_, span)) => at(span.clone(), msg),
                None => ProfileError::Invalid { file: file.to_string(), msg },
            },
        );
    }
    Ok(())
}

/// Finds the first key of `user` that `known` does not have (its span and a message listing
/// the valid keys there); collects the dotted path and span of every leaf value.
fn check_keys(
    known: &toml::Table,
    user: &DeTable<'_>,
    prefix: &str,
    leaves: &mut Vec<(String, Range<usize>)>,
) -> Result<(), (Range<usize>, String)> {
    let mut entries: Vec<_> = user.iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    for (k, v) in entries {
        let name = k.get_ref().as_ref();
        let path = format!("{prefix}{name}");
        match (known.get(name), v.get_ref()) {
            (None, _) => {
                let valid: Vec<&str> = known.keys().map(|k| k.as_str()).collect();
                let within = if prefix.is_empty() {
                    "[params]".to_string()
                } else {
                    format!("[params.{}]", prefix.trim_end_matches('.'))
                };
                return Err((
                    k.span(),
                    format!("unknown key `{name}` in {within}; valid: {}", valid.join(", ")),
                ));
            }
            (Some(toml::Value::Table(kt)), DeValue::Table(ut)) => {
                check_keys(kt, ut, &format!("{path}."), leaves)?;
            }
            (Some(toml::Value::Table(kt)), _) => {
                let valid: Vec<&str> = kt.keys().map(|k| k.as_str()).collect();
                return Err((v.span(), format!("`{path}` is a table of {}", valid.join(", "))));
            }
            _ => leaves.push((path, v.span())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_a_params_table() {
        let p = parse_profile("[params.link.net]\nefficiency = 0.8\n", "p.toml").unwrap();
        assert!(p.contains_key("link"));
        let e = parse_profile("x = 1\n", "p.toml").unwrap_err().to_string();
        assert!(e.contains("[params]"), "{e}");
        let e = parse_profile("[params\n", "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:1:"), "{e}");
    }

    /// Issue 13: a typo in a profile was reported against the topology file with no line
    /// (or, in a scenario, made every point "rejected by the model").
    #[test]
    fn unknown_keys_and_bad_values_are_located_in_the_profile() {
        let text = "# profile\n[params.link.net]\nefficency = 0.8\n";
        let e = parse_profile(text, "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:3:1:") && e.contains("efficency") && e.contains("efficiency"), "{e}");
        let text = "[params]\nlinks = 1\n";
        let e = parse_profile(text, "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:2:1:") && e.contains("link"), "{e}");
        let text = "[params.link.net]\nlatency = \"600ns\"\nefficiency = 2.0\n";
        let e = parse_profile(text, "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:3:") && e.contains("(0, 1]"), "{e}");
        let text = "[params]\nlink = 3\n";
        let e = parse_profile(text, "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:2:") && e.contains("table"), "{e}");
        let e = parse_profile("[params]\n[other]\n", "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:2:") && e.contains("other"), "{e}");
        // calibrate's metadata table is accepted and not read.
        let p = parse_profile("[params]\n[calibration]\ninputs = [\"a.log\"]\n", "p.toml").unwrap();
        assert!(p.is_empty());
        // The compute model's constants: accepted, typos and ranges located.
        let p = parse_profile("[params.compute]\ngemm_eff = 0.6\n", "p.toml").unwrap();
        assert!(p.contains_key("compute"));
        let e = parse_profile("[params.compute]\ngemm_ef = 0.6\n", "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:2:1:") && e.contains("gemm_eff_fp8"), "{e}");
        let e = parse_profile("[params.compute]\nhbm_eff = 1.5\n", "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:2:") && e.contains("compute.hbm_eff") && e.contains("(0, 1]"), "{e}");
    }
}
