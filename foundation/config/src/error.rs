use std::fmt;

/// One thing wrong with a configuration: where (a dotted path such as `listeners.admin.address`)
/// and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field; empty for errors about the document as a whole.
    pub path: String,
    /// What is wrong, phrased for the operator.
    pub reason: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

/// Every error found in one configuration source, in document order. Loading either yields a
/// whole valid config or this; nothing is applied partially.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// Where the config came from: a file path, or a name such as `<embedded defaults>`.
    pub origin: String,
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.errors.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {}", self.origin, error)?;
        }
        Ok(())
    }
}

/// Collects errors during the single validation pass.
#[derive(Debug, Default)]
pub(crate) struct Errors {
    pub(crate) list: Vec<FieldError>,
}

impl Errors {
    pub(crate) fn push(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.list.push(FieldError::new(path, reason));
    }
}
