//! A validating JSON scanner over bytes, with limits on depth, and the error type
//! shared by every decoder of the core.

use std::fmt;

/// Why bytes could not be decoded: a message, and where possible the wire field
/// and the byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub message: String,
    pub field: Option<String>,
    pub offset: Option<usize>,
}

impl JsonError {
    #[must_use]
    pub fn at(offset: usize, message: impl Into<String>) -> Self {
        JsonError { message: message.into(), field: None, offset: Some(offset) }
    }

    #[must_use]
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        JsonError { message: message.into(), field: Some(field.into()), offset: None }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(field) = &self.field {
            write!(f, "field '{field}': ")?;
        }
        f.write_str(&self.message)?;
        if let Some(offset) = self.offset {
            write!(f, " at byte {offset}")?;
        }
        Ok(())
    }
}

impl std::error::Error for JsonError {}
