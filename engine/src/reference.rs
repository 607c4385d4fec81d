//! reference (being written)
