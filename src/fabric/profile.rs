//! Calibration profiles on disk: a TOML file whose `[params]` table overrides model
//! parameters (the same keys as `src/fabric/params.toml`). This module only reads and checks
//! the file's shape; the fabric builder applies and validates the parameters themselves.
//!
//! Architecture invariant: knows TOML and file paths, nothing of scenarios or of how the
//! parameters are used.

use std::path::Path;

use super::file::line_col;

/// A calibration profile that cannot be used.
pub type ProfileError = crate::fabric::file::FileError;

/// Reads a calibration profile and returns its `[params]` table.
pub fn load_profile(path: &Path) -> Result<toml::Table, ProfileError> {
    let file = path.display().to_string();
    let text =
        std::fs::read_to_string(path).map_err(|source| ProfileError::Io { file: file.clone(), source })?;
    parse_profile(&text, &file)
}

/// Parses profile text (`file` names it in messages).
pub fn parse_profile(text: &str, file: &str) -> Result<toml::Table, ProfileError> {
    let t: toml::Table = toml::from_str(text).map_err(|e| match e.span() {
        Some(s) => {
            let (line, col) = line_col(text, s.start);
            ProfileError::At { file: file.to_string(), line, col, msg: e.message().to_string() }
        }
        None => ProfileError::Invalid { file: file.to_string(), msg: e.message().to_string() },
    })?;
    match t.get("params") {
        Some(toml::Value::Table(p)) => Ok(p.clone()),
        Some(_) => {
            Err(ProfileError::Invalid { file: file.to_string(), msg: "`params` must be a table".into() })
        }
        None => Err(ProfileError::Invalid {
            file: file.to_string(),
            msg: "a calibration profile needs a [params] table (same keys as fabric/params.toml)".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_a_params_table() {
        assert!(parse_profile("[params]\nx = 1\n", "p.toml").unwrap().contains_key("x"));
        let e = parse_profile("x = 1\n", "p.toml").unwrap_err().to_string();
        assert!(e.contains("[params]"), "{e}");
        let e = parse_profile("[params\n", "p.toml").unwrap_err().to_string();
        assert!(e.starts_with("p.toml:1:"), "{e}");
    }
}
