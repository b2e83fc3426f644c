//! pure core
