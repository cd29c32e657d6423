"""benchmarks/stall_sampler.py groups a gdb dump by the first frame that is not plumbing (what found
issue 22's stalls: tf.data's autotuning thread joined by an iterator's destructor)."""

from tests.helpers import load_script

stall_sampler = load_script("benchmarks/stall_sampler.py")

_DUMP = """
Thread 3 (Thread 0x7f (LWP 12) "grpcpp_sync_ser"):
#0  0x0000 in syscall () from /lib/libc.so.6
#1  0x0000 in nsync::nsync_cv_wait_with_deadline(nsync::nsync_cv_s_*) ()
#2  0x0000 in tensorflow::data::model::Model::OptimizeLoop(long) ()
#3  0x0000 in std::_Function_handler<void ()>::_M_invoke(std::_Any_data const&) ()

Thread 2 (Thread 0x7e (LWP 11) "grpcpp_sync_ser"):
#0  0x0000 in syscall () from /lib/libc.so.6
#1  0x0000 in nsync::nsync_cv_wait(nsync::nsync_cv_s_*, nsync::nsync_mu_s_*) ()
#2  0x0000 in tensorflow::data::UnboundedThreadPool::LogicalThreadWrapper::~LogicalThreadWrapper() ()
#3  0x0000 in tensorflow::data::RootDataset::Iterator::~Iterator() ()

Thread 1 (Thread 0x7d (LWP 10) "worker_binary"):
#0  0x0000 in __futex_abstimed_wait_common64 () from /lib/libc.so.6
#1  0x0000 in std::condition_variable::wait(std::unique_lock<std::mutex>&) ()
"""


def test_threads_are_grouped_by_their_first_frame_that_is_not_plumbing():
  found = stall_sampler.group_stacks(_DUMP)
  assert found == {
    "tensorflow::data::model::Model::OptimizeLoop(long)": 1,
    "tensorflow::data::UnboundedThreadPool::LogicalThreadWrapper::~LogicalThreadWrapper()": 1,
    "(idle: __futex_abstimed_wait_common64)": 1,
  }
