use std::fmt;
use std::path::PathBuf;

/// One problem in a config file: where (file, YAML document, field path) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based index of the `---` document, when the file holds more than one.
    pub document: Option<usize>,
    /// Like `spec.dispatchPolicies[1].flowControlSchemaName`; empty for whole-file problems.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}", self.file.display())?;
        if let Some(document) = self.document {
            write!(formatter, " (document {document})")?;
        }
        if !self.path.is_empty() {
            write!(formatter, ": {}", self.path)?;
        }
        write!(formatter, ": {}", self.reason)
    }
}

/// Every problem found in a config load; nothing is applied when there is any.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} config error(s)", self.0.len())?;
        for error in &self.0 {
            write!(formatter, "\n  {error}")?;
        }
        Ok(())
    }
}
