//! explain (being written)
