package cuda

import (
	"errors"
	"fmt"
	"strings"
)

// ErrNoDriver reports that no usable CUDA driver was found: libcuda.so.1 could
// not be loaded, lacks a required symbol, or cuInit failed (for example, no
// device). Every CPU path of gear still works; errors.Is(err, ErrNoDriver) tells a
// caller to use it.
var ErrNoDriver = errors.New("cuda: no CUDA driver")

// ErrNoNCCL reports that libnccl.so.2 could not be found or loaded.
var ErrNoNCCL = errors.New("cuda: no NCCL")

// ErrClosed reports a call on a Device, Gatherer, Sampler or NCCLComm after Close.
var ErrClosed = errors.New("cuda: closed")

// ErrNotSupported reports a call the loaded driver does not offer (an entry
// point newer than the driver, such as cuMemcpyBatchAsync before CUDA 12.8).
var ErrNotSupported = errors.New("cuda: not supported by this driver")

// ErrAborted reports an NCCL communicator that was aborted (by a cancelled
// context, a lost peer, an asynchronous NCCL error, or Abort). The communicator
// cannot be used again; the error of the operation that aborted it wraps both
// ErrAborted and the cause.
var ErrAborted = errors.New("cuda: NCCL communicator aborted")

// wrapped is a sentinel with its cause, read as "<sentinel>: <cause>" without a
// second "cuda: " prefix.
type wrapped struct {
	sentinel, cause error
}

func (e *wrapped) Error() string {
	return e.sentinel.Error() + ": " + strings.TrimPrefix(e.cause.Error(), "cuda: ")
}

func (e *wrapped) Unwrap() []error { return []error{e.sentinel, e.cause} }

// Result is a CUresult, the status code of a CUDA driver call.
type Result int32

// CUDA driver status codes that callers may want to test for.
const (
	Success                      Result = 0
	ErrorInvalidValue            Result = 1
	ErrorOutOfMemory             Result = 2
	ErrorNotInitialized          Result = 3
	ErrorNoDevice                Result = 100
	ErrorInvalidDevice           Result = 101
	ErrorInvalidImage            Result = 200
	ErrorInvalidContext          Result = 201
	ErrorAlreadyMapped           Result = 208
	ErrorNoBinaryForGPU          Result = 209
	ErrorInvalidPTX              Result = 218
	ErrorUnsupportedPTXVersion   Result = 222
	ErrorInvalidHandle           Result = 400
	ErrorNotFound                Result = 500
	ErrorNotReady                Result = 600
	ErrorIllegalAddress          Result = 700
	ErrorLaunchOutOfResources    Result = 701
	ErrorHostMemoryAlreadyMapped Result = 712
	ErrorHostMemoryNotRegistered Result = 713
	ErrorLaunchFailed            Result = 719
	ErrorContextIsDestroyed      Result = 709
	ErrorNotSupported            Result = 801
	ErrorUnknown                 Result = 999
)

// resultNames is the fallback for cuGetErrorName, used when the driver cannot
// name a code (or is not loaded).
var resultNames = map[Result]string{
	0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
	3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY",
	46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
	200: "CUDA_ERROR_INVALID_IMAGE", 201: "CUDA_ERROR_INVALID_CONTEXT", 208: "CUDA_ERROR_ALREADY_MAPPED", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", 400: "CUDA_ERROR_INVALID_HANDLE",
	500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", 709: "CUDA_ERROR_CONTEXT_IS_DESTROYED", 719: "CUDA_ERROR_LAUNCH_FAILED",
	801: "CUDA_ERROR_NOT_SUPPORTED", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	999: "CUDA_ERROR_UNKNOWN",
}

// Error is a failed CUDA driver call. Its text is
// "cuda: <function>: <CUDA_ERROR_NAME> (<code>): <description>".
type Error struct {
	Func string // the driver symbol, e.g. "cuMemAlloc_v2"
	Code Result
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Desc string // the driver's description; may be empty
}

func (e *Error) Error() string {
	s := fmt.Sprintf("cuda: %s: %s (%d)", e.Func, e.Name, int32(e.Code))
	if e.Desc != "" {
		s += ": " + e.Desc
	}
	return s
}

// NCCLResult is an ncclResult_t.
type NCCLResult int32

// NCCL status codes.
const (
	NCCLSuccess            NCCLResult = 0
	NCCLUnhandledCudaError NCCLResult = 1
	NCCLSystemError        NCCLResult = 2
	NCCLInternalError      NCCLResult = 3
	NCCLInvalidArgument    NCCLResult = 4
	NCCLInvalidUsage       NCCLResult = 5
	NCCLRemoteError        NCCLResult = 6
	NCCLInProgress         NCCLResult = 7
	NCCLTimeout            NCCLResult = 8
)

var ncclResultNames = [...]string{
	"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout",
}

// String returns the ncclResult_t constant's name.
func (r NCCLResult) String() string {
	if r >= 0 && int(r) < len(ncclResultNames) {
		return ncclResultNames[r]
	}
	return fmt.Sprintf("ncclResult(%d)", int32(r))
}

// NCCLError is a failed NCCL call. Its text is
// "cuda: <function>: <ncclResult> (<code>): <description>[: <last error>]".
type NCCLError struct {
	Func string // e.g. "ncclAllReduce"
	Code NCCLResult
	Desc string // ncclGetErrorString
	Last string // ncclGetLastError, when the library has it and said something
}

func (e *NCCLError) Error() string {
	s := fmt.Sprintf("cuda: %s: %s (%d)", e.Func, e.Code, int32(e.Code))
	if e.Desc != "" {
		s += ": " + e.Desc
	}
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}
