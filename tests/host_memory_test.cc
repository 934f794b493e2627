// The memory this process may use and the CPU allocator's default cap
// (core/cpu.h): the derivation from each source with figures of its own,
// the parsing of /proc and cgroup text, and the figures of this machine.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/cpu.h"
#include "core/env.h"
#include "core/memory.h"

namespace {

const size_t MiB = (size_t)1 << 20, GiB = (size_t)1 << 30;

// The figures: MemAvailable, the cgroup's limit and use, RLIMIT_AS and
// what is mapped, RLIMIT_DATA and the data mapped (0: unknown, unlimited).
dt_host_memory figures(size_t available, size_t cgroup_limit = 0, size_t cgroup_used = 0,
                       size_t as_limit = 0, size_t as_used = 0, size_t data_limit = 0,
                       size_t data_used = 0) {
  // In the struct's order (core/cpu.h).
  dt_host_memory m = {cgroup_limit, cgroup_used, available, as_limit,
                      as_used,      data_limit,  data_used};
  return m;
}

std::string describe(const dt_host_memory_cap &c) {
  char buf[256];
  return dt_host_memory_cap_describe(&c, buf, sizeof buf);
}

TEST(HostMemoryField, ProcAndCgroupText) {
  const char *meminfo =
      "MemTotal:       24683784 kB\nMemFree:         1000000 kB\n"
      "MemAvailable:   22479228 kB\nBuffers:           12 kB\n";
  size_t v = 0;
  ASSERT_TRUE(dt_host_memory_field(meminfo, "MemAvailable:", &v));
  EXPECT_EQ(v, (size_t)22479228 * 1024);
  ASSERT_TRUE(dt_host_memory_field(meminfo, "MemTotal:", &v));
  EXPECT_EQ(v, (size_t)24683784 * 1024);
  EXPECT_FALSE(dt_host_memory_field(meminfo, "SwapTotal:", &v));
  EXPECT_FALSE(dt_host_memory_field(meminfo, "MemAvail", &v)) << "a whole key only";
  const char *status = "Name:\tdtrain\nVmPeak:\t 2000 kB\nVmSize:\t 1024 kB\nVmData:\t   512 kB\n";
  ASSERT_TRUE(dt_host_memory_field(status, "VmSize:", &v));
  EXPECT_EQ(v, (size_t)1024 * 1024);
  ASSERT_TRUE(dt_host_memory_field(status, "VmData:", &v));
  EXPECT_EQ(v, (size_t)512 * 1024);
  // memory.stat: bytes, no unit; "file" is not "file_mapped".
  const char *stat = "anon 4096\nfile_mapped 7\nfile 8192\ntotal_cache 123\n";
  ASSERT_TRUE(dt_host_memory_field(stat, "file", &v));
  EXPECT_EQ(v, 8192u);
  ASSERT_TRUE(dt_host_memory_field(stat, "total_cache", &v));
  EXPECT_EQ(v, 123u);
}

// What is not a tensor: an eighth of the room, at least 256 MiB or half
// the room, whichever is smaller.
TEST(HostMemoryCap, HeadroomRule) {
  dt_host_memory m = figures(64 * GiB);
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 0);
  EXPECT_EQ(c.room, 64 * GiB);
  EXPECT_EQ(c.bytes, 56 * GiB);  // an eighth
  m.mem_available = 1 * GiB;
  EXPECT_EQ(dt_host_memory_default_cap(&m, 0).bytes, 768 * MiB);  // 256 MiB
  m.mem_available = 300 * MiB;
  EXPECT_EQ(dt_host_memory_default_cap(&m, 0).bytes, 150 * MiB);  // half
  m.mem_available = 1024;
  EXPECT_EQ(dt_host_memory_default_cap(&m, 0).bytes, 1 * MiB) << "never 0, which is no cap";
}

TEST(HostMemoryCap, NoSource) {
  dt_host_memory m = figures(0);
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 1 * GiB);
  EXPECT_EQ(c.source, DT_HOST_CAP_NONE);
  EXPECT_EQ(c.bytes, 0u);
  EXPECT_NE(describe(c).find("no cap"), std::string::npos);
}

TEST(HostMemoryCap, MemAvailable) {
  dt_host_memory m = figures(8 * GiB);
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 4 * GiB);  // reserve: address space only
  EXPECT_EQ(c.source, DT_HOST_CAP_MEM_AVAILABLE);
  EXPECT_EQ(c.room, 8 * GiB);
  EXPECT_EQ(c.bytes, 7 * GiB);
  EXPECT_EQ(describe(c), "default: 7.00 GiB of the 8.00 GiB MemAvailable (/proc/meminfo) leaves");
}

TEST(HostMemoryCap, Cgroup) {
  // The cgroup's use: its processes' (ours too), less page cache.
  dt_host_memory m = figures(20 * GiB, 4 * GiB, 1 * GiB);
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 0);
  EXPECT_EQ(c.source, DT_HOST_CAP_CGROUP);
  EXPECT_EQ(c.room, 3 * GiB);
  EXPECT_EQ(c.bytes, 3 * GiB - 3 * GiB / 8);
  EXPECT_NE(describe(c).find("the cgroup's memory limit"), std::string::npos) << describe(c);
  m.cgroup_used = 5 * GiB;  // already over: the least cap, not none
  c = dt_host_memory_default_cap(&m, 0);
  EXPECT_EQ(c.source, DT_HOST_CAP_CGROUP);
  EXPECT_EQ(c.bytes, 1 * MiB);
}

TEST(HostMemoryCap, AddressSpaceLimitLessOpenBlasBuffers) {
  dt_host_memory m = figures(20 * GiB, 0, 0, 4 * GiB, 1 * GiB);  // 1 GiB: the libraries
  size_t reserve = dt_host_blas_reserve(2, 0);
  EXPECT_EQ(reserve,
            4 * DT_HOST_BLAS_BUFFER_BYTES);  // two threads: a pool and a caller buffer each
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, reserve);
  EXPECT_EQ(c.source, DT_HOST_CAP_RLIMIT_AS);
  EXPECT_EQ(c.room, 3 * GiB - reserve);
  EXPECT_EQ(c.bytes, c.room - c.room / 8);
  EXPECT_NE(describe(c).find("RLIMIT_AS, ulimit -v"), std::string::npos) << describe(c);
  // Buffers OpenBLAS holds already are in as_used.
  EXPECT_EQ(dt_host_blas_reserve(2, 2), 2 * DT_HOST_BLAS_BUFFER_BYTES);
  EXPECT_EQ(dt_host_blas_reserve(1, 4), 0u);
}

TEST(HostMemoryCap, DataLimit) {
  dt_host_memory m = figures(20 * GiB, 0, 0, 16 * GiB, 1 * GiB, 2 * GiB, 512 * MiB);
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 0);
  EXPECT_EQ(c.source, DT_HOST_CAP_RLIMIT_DATA);
  EXPECT_EQ(c.room, 1536 * MiB);
  EXPECT_EQ(c.bytes, 1536 * MiB - 256 * MiB);
  EXPECT_NE(describe(c).find("RLIMIT_DATA, ulimit -d"), std::string::npos) << describe(c);
}

TEST(HostMemoryCap, SmallestSourceBinds) {
  dt_host_memory m = figures(3 * GiB, 8 * GiB, 0, 64 * GiB, 2 * GiB);
  EXPECT_EQ(dt_host_memory_default_cap(&m, 0).source, DT_HOST_CAP_MEM_AVAILABLE);
  m.cgroup_used = 6 * GiB;
  EXPECT_EQ(dt_host_memory_default_cap(&m, 0).source, DT_HOST_CAP_CGROUP);
}

TEST(HostAddressSpace, ThreadsWhoseBuffersFit) {
  dt_host_memory m = figures(0);
  EXPECT_EQ(dt_host_address_room(&m), SIZE_MAX);
  EXPECT_EQ(dt_host_blas_threads_fitting(&m, 64, 0), 64) << "unlimited";
  m = figures(0, 0, 0, 2 * GiB, 1 * GiB);
  EXPECT_EQ(dt_host_address_room(&m), 1 * GiB);
  // n threads need 2n buffers of 129 MiB, 2 of them mapped: 6 more and
  // 64 MiB to spare fit in 1 GiB, 8 more do not.
  EXPECT_EQ(dt_host_blas_threads_fitting(&m, 8, 2), 4);
  EXPECT_EQ(dt_host_blas_threads_fitting(&m, 2, 2), 2);
  m.as_used = 2 * GiB;
  EXPECT_EQ(dt_host_address_room(&m), 0u);
  EXPECT_EQ(dt_host_blas_threads_fitting(&m, 8, 2), 1) << "at least one";
  m.data_limit = 1 * GiB;
  m.data_used = 2 * GiB;
  m.as_used = 0;
  EXPECT_EQ(dt_host_address_room(&m), 0u) << "the data limit binds";
}

TEST(HostAddressSpace, OpenBlasStartUpPool) {
  EXPECT_EQ(dt_host_blas_pool(nullptr, 2), 2);  // every configured CPU
  EXPECT_EQ(dt_host_blas_pool("1", 64), 1);
  EXPECT_EQ(dt_host_blas_pool("8,4", 2), 8);  // nested lists: the outer level
  EXPECT_EQ(dt_host_blas_pool("0", 4), 4);
  EXPECT_EQ(dt_host_blas_pool("junk", 4), 4);
  EXPECT_EQ(dt_host_blas_pool(nullptr, 0), 1);
  // A buffer per pool thread and one for the first caller, and the spare.
  EXPECT_EQ(dt_host_blas_room_needed(1), 2 * DT_HOST_BLAS_BUFFER_BYTES + DT_HOST_MIN_ROOM);
  EXPECT_EQ(dt_host_blas_room_needed(4), 5 * DT_HOST_BLAS_BUFFER_BYTES + DT_HOST_MIN_ROOM);
}

// The figures of this machine: /proc is read (the derivation from them is
// the tests above).
TEST(HostMemoryRead, ThisMachine) {
  dt_host_memory m;
  dt_host_memory_read(&m);
  EXPECT_GT(m.mem_available, 0u);
  EXPECT_LE(m.cgroup_used, m.cgroup_limit ? SIZE_MAX : 0) << "no limit, no use read";
  dt_host_memory_cap c = dt_host_memory_default_cap(&m, 0);
  EXPECT_NE(c.source, DT_HOST_CAP_NONE);
  EXPECT_GT(c.bytes, 0u);
  EXPECT_LT(c.bytes, c.room);
}

// Without DT_CPU_MEMORY_LIMIT the CPU allocator runs under the default cap.
TEST(CpuDefaultCap, InForceWithoutTheVariable) {
  if (dt_env_is_set(DT_ENV_CPU_MEMORY_LIMIT))
    GTEST_SKIP() << "DT_CPU_MEMORY_LIMIT is set";
  dt_memory_stats ms;
  ASSERT_EQ(dt_memory_stats_get(dt_device{DT_DEVICE_CPU, 0}, &ms), DT_OK) << dt_last_error();
  EXPECT_GT(ms.limit, 0u);
  std::string source = dt_cpu_memory_limit_source();
  EXPECT_EQ(source.rfind("default: ", 0), 0u) << source;
}

}  // namespace
