//! The one translation from containerd's gRPC answers to the ports' error
//! ([`BackendError`](crate::backend_error::BackendError)): a failed call's `tonic::Code`
//! becomes a [`BackendCode`], as `cri::error` is the one translation the other way, from the
//! core's errors to the gRPC status a CRI caller sees.

use tonic::Code;

use crate::backend_error::BackendCode;

/// The port's words for the code of a failed call.
pub fn backend_code(code: Code) -> BackendCode {
    // A failed call never answers `Ok` (tonic makes a status of `Ok` a success); should one,
    // it is as unclassified as `Unknown`.
    BackendCode::from_grpc_number(i32::from(code)).unwrap_or(BackendCode::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_of_a_failed_call_keeps_its_name() {
        for code in [
            Code::Cancelled,
            Code::Unknown,
            Code::InvalidArgument,
            Code::DeadlineExceeded,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
            Code::Unauthenticated,
        ] {
            assert_eq!(format!("{code:?}"), format!("{:?}", backend_code(code)));
        }
        assert_eq!(backend_code(Code::Ok), BackendCode::Unknown);
    }
}
