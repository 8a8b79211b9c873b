#ifndef KVTIER_DAEMON_PI_MUTEX_H_
#define KVTIER_DAEMON_PI_MUTEX_H_

// A mutex with priority inheritance (PTHREAD_PRIO_INHERIT): while a real-time thread waits for
// it, the holder runs at that thread's priority. kvtierd's heartbeat lane runs at SCHED_FIFO and
// takes the core's lease lock for a moment per heartbeat (the snapshot lane takes the core's
// lock); the holder is often an ordinary thread, which on a host full of busy workers may wait a
// whole scheduler slice (a millisecond and more) for a CPU while it holds the lock, and the
// real-time thread with it (priority inversion). Uncontended, it costs what any mutex does (an
// atomic in user space).

#include <pthread.h>

#include "absl/base/thread_annotations.h"

namespace kvtier::daemon {

class ABSL_LOCKABLE PiMutex {
 public:
  PiMutex() {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setprotocol(&attr, PTHREAD_PRIO_INHERIT);
    pthread_mutex_init(&mu_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~PiMutex() { pthread_mutex_destroy(&mu_); }
  PiMutex(const PiMutex&) = delete;
  PiMutex& operator=(const PiMutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { pthread_mutex_lock(&mu_); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { pthread_mutex_unlock(&mu_); }

 private:
  pthread_mutex_t mu_;
};

// Holds a PiMutex for its scope.
class ABSL_SCOPED_LOCKABLE PiMutexLock {
 public:
  explicit PiMutexLock(PiMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~PiMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  PiMutexLock(const PiMutexLock&) = delete;
  PiMutexLock& operator=(const PiMutexLock&) = delete;

 private:
  PiMutex* const mu_;
};

}  // namespace kvtier::daemon

#endif  // KVTIER_DAEMON_PI_MUTEX_H_
