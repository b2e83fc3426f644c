#![allow(dead_code)]
pub mod datadriven;
pub mod runner;
