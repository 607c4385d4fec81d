//! ruletest (being written)
