/* cgroup.c - the limits a process's cgroups put on it (a container's CPU
 * quota, its memory limit), read as the kernel applies them: the least
 * over the process's own cgroup and every parent up to the hierarchy's
 * root, in cgroup v2 (/sys/fs/cgroup) or in v1's mount of the controller.
 * A container sees its own cgroup as the root, so a path from
 * /proc/self/cgroup that is not under the mount is read at the root. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

/* Not read_file: that one asks mem_limit, which asks this. */
bool cgroup_read(const char *dir, const char *name, char *buf, size_t n) {
  char path[4352];
  if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return false;
  FILE *f = fopen(path, "r");
  if (!f) return false;
  bool ok = fgets(buf, (int)n, f) != NULL;
  fclose(f);
  if (ok) buf[strcspn(buf, "\n")] = '\0';
  return ok;
}

/* The least non-zero limit on root/rel and its parents up to root. */
static uint64_t least_up(const char *root, const char *rel, bool v2, CgroupLimitFn limit) {
  char d[4096];
  if (snprintf(d, sizeof d, "%s%s", root, rel) >= (int)sizeof d) return 0;
  size_t top = strlen(root);
  uint64_t best = 0;
  for (;;) {
    uint64_t x = limit(d, v2);
    if (x > 0 && (best == 0 || x < best)) best = x;
    char *slash = strrchr(d, '/');
    if (!slash || (size_t)(slash - d) < top) return best;
    *slash = '\0'; /* root/a/b -> root/a -> root */
  }
}

/* Whether the comma-separated controller list ctl names controller. */
static bool names(const char *ctl, const char *controller) {
  size_t len = strlen(controller);
  for (const char *p = ctl; *p;) {
    size_t n = strcspn(p, ",");
    if (n == len && strncmp(p, controller, n) == 0) return true;
    p += n + (p[n] == ',');
  }
  return false;
}

uint64_t cgroup_least_limit(const char *controller, CgroupLimitFn limit) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return 0;
  char line[4096];
  uint64_t best = 0;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c2 = '\0';
    const char *ctl = c1 + 1, *rel = strcmp(c2 + 1, "/") == 0 ? "" : c2 + 1;
    bool v2 = ctl[0] == '\0';
    char root[512] = "/sys/fs/cgroup";
    if (!v2) {
      if (!names(ctl, controller)) continue;
      /* v1 mounts a controller at its name, or at its hierarchy's list
       * ("cpu,cpuacct") with the names as links. */
      snprintf(root, sizeof root, "/sys/fs/cgroup/%s", controller);
      if (access(root, F_OK) != 0) snprintf(root, sizeof root, "/sys/fs/cgroup/%s", ctl);
    }
    char dir[4608];
    if (snprintf(dir, sizeof dir, "%s%s", root, rel) >= (int)sizeof dir || access(dir, F_OK) != 0) rel = "";
    uint64_t x = least_up(root, rel, v2, limit);
    if (x > 0 && (best == 0 || x < best)) best = x;
  }
  fclose(f);
  return best;
}
