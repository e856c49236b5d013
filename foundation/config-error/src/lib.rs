//! The one vocabulary for configuration errors, shared by every loader (daemon config,
//! UpstreamCluster files, policy files): a field path and a reason, collected in one validation
//! pass, grouped by the source they came from. A load yields either a whole valid value or all
//! of its errors; nothing is applied partially.

use std::fmt;

/// One thing wrong with a configuration: where (a dotted path such as
/// `listeners.admin.address` or `spec.dispatchPolicies[1].flowControlSchemaName`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Path of the field; empty for errors about the source as a whole.
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

/// Every error found in one source, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidConfig {
    /// Where the config came from: a file path (with ` (document N)` when a multi-document
    /// file's document is meant), or a name such as `<embedded defaults>`.
    pub origin: String,
    pub errors: Vec<FieldError>,
}

impl InvalidConfig {
    /// A source with a single error.
    pub fn one(
        origin: impl Into<String>,
        path: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            origin: origin.into(),
            errors: vec![FieldError::new(path, reason)],
        }
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.errors.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}: {error}", self.origin)?;
        }
        Ok(())
    }
}

/// Every error of a set of sources (a directory of files), grouped by source in load order.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct InvalidSources {
    pub sources: Vec<InvalidConfig>,
}

impl InvalidSources {
    /// Number of field errors over all sources.
    pub fn error_count(&self) -> usize {
        self.sources.iter().map(|source| source.errors.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Adds one error of `origin`, joining the group of that origin when it is the last one.
    pub fn push(
        &mut self,
        origin: impl Into<String>,
        path: impl Into<String>,
        reason: impl Into<String>,
    ) {
        let origin = origin.into();
        let error = FieldError::new(path, reason);
        match self.sources.last_mut() {
            Some(last) if last.origin == origin => last.errors.push(error),
            _ => self.sources.push(InvalidConfig {
                origin,
                errors: vec![error],
            }),
        }
    }

    /// Every error as one line, `origin: path: reason`.
    pub fn lines(&self) -> impl Iterator<Item = String> + '_ {
        self.sources.iter().flat_map(|source| {
            source
                .errors
                .iter()
                .map(move |error| format!("{}: {error}", source.origin))
        })
    }
}

impl From<InvalidConfig> for InvalidSources {
    fn from(source: InvalidConfig) -> Self {
        Self {
            sources: vec![source],
        }
    }
}

impl fmt::Display for InvalidSources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, source) in self.sources.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{source}")?;
        }
        Ok(())
    }
}

/// Collects the errors of one source during the single validation pass.
#[derive(Debug, Default)]
pub struct ErrorList {
    pub list: Vec<FieldError>,
}

impl ErrorList {
    pub fn push(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.list.push(FieldError::new(path, reason));
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// `Ok` when nothing was found, else every error under `origin`.
    pub fn finish(self, origin: &str) -> Result<(), InvalidConfig> {
        if self.list.is_empty() {
            Ok(())
        } else {
            Err(self.into_invalid(origin))
        }
    }

    pub fn into_invalid(self, origin: &str) -> InvalidConfig {
        InvalidConfig {
            origin: origin.to_string(),
            errors: self.list,
        }
    }
}

/// Names a document of a multi-document file in an origin: `file (document N)`.
pub fn document_origin(file: &str, document: Option<usize>) -> String {
    match document {
        Some(number) => format!("{file} (document {number})"),
        None => file.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_origin_path_and_reason() {
        let mut all = InvalidSources::default();
        all.push("a.yaml", "spec.x", "must be set");
        all.push("a.yaml", "", "cannot read file");
        all.push(
            document_origin("b.yaml", Some(2)),
            "metadata.name",
            "duplicate",
        );
        assert_eq!(all.sources.len(), 2);
        assert_eq!(all.error_count(), 3);
        assert_eq!(
            all.lines().collect::<Vec<_>>(),
            [
                "a.yaml: spec.x: must be set",
                "a.yaml: cannot read file",
                "b.yaml (document 2): metadata.name: duplicate",
            ]
        );
        assert_eq!(all.to_string(), all.lines().collect::<Vec<_>>().join("\n"));
    }

    #[test]
    fn an_empty_list_finishes_ok() {
        assert!(ErrorList::default().finish("x").is_ok());
        let mut list = ErrorList::default();
        list.push("a", "b");
        let error = list.finish("file").unwrap_err();
        assert_eq!(error.to_string(), "file: a: b");
    }
}
