//! CNI plugin execution.
