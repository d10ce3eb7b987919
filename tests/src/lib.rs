//! Cross-crate integration tests of the workspace; the tests themselves live in `tests/tests/`.
//!
//! This library holds only helpers shared between those tests.
