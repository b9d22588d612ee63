/* sim_main.c - xpyd_sim command line: parses flags into a sim_config and runs the simulator. */
#include "sim.h"

#include "xpyd_util.h"
#include "xpyd_version.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void sim_config_defaults(struct sim_config *c)
{
    memset(c, 0, sizeof *c);
    c->role = SIM_ROLE_BOTH;
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8000;
    snprintf(c->model, sizeof c->model, "sim-model");
    c->max_model_len = 8192;
    c->dp_size = 1;
    c->prefill_us_per_token = 20;
    c->decode_us_per_token = 2000;
    c->max_batch = 256;
    c->handoff = SIM_HANDOFF_KV_PARAMS;
    snprintf(c->store_dir, sizeof c->store_dir, "/tmp/xpyd-sim-store");
    c->store_wait_ms = 10000;
    c->handoff_timeout_ms = 10000;
    c->lease_ms = 30000;
    c->kv_bytes_per_token = 64;
    c->fail_after_tokens = -1;
    c->max_body_bytes = 16 << 20;
    c->log_level = XPYD_LOG_INFO;
}

static void usage(FILE *f)
{
    fputs("usage: xpyd_sim [options]\n"
          "A simulated vLLM engine (OpenAI API, PD handoff, DP ranks, faults) for testing xpyd without GPUs.\n\n"
          "  --role prefill|decode|both   engine role in PD disaggregation (default both)\n"
          "  --host ADDR                  listen address (default 127.0.0.1; IPv6 like ::1 works)\n"
          "  --port N                     listen port (default 8000; 0 = any free port, dp-size 1 or internal only)\n"
          "  --port-file PATH             write the bound port here once listening (readiness for scripts)\n"
          "  --model NAME                 served model name (default sim-model)\n"
          "  --max-model-len N            context length: prompt + max_tokens limit (default 8192)\n"
          "  --seed N                     seed of the generated tokens; prefill and decode must share it (default 0)\n"
          "  --dp-size N                  data-parallel ranks (default 1)\n"
          "  --dp-mode external|internal  external: rank r listens on port+r; internal: one port, rank pinned by\n"
          "                               X-data-parallel-rank, else least busy (default external)\n"
          "  --prefill-us-per-token N     prefill compute time per prompt token, us (default 20; 0 = instant)\n"
          "  --decode-us-per-token N      inter-token latency, us (default 2000; 0 = as fast as possible)\n"
          "  --max-batch N                running requests per rank; the rest wait (default 256)\n"
          "  --kv-capacity-tokens N       KV tokens a rank holds; a request waits until its prompt fits (default 0: no limit)\n"
          "  --decode-ns-per-kv-token N   each decode step takes this much longer per KV token the rank holds (default 0)\n"
          "  --handoff kv-params|store|bootstrap|none|xpyd   PD handoff this engine speaks (default kv-params;\n"
          "                               xpyd: kv-params with the KV moved by libxpyd_transfer)\n"
          "  --store-dir DIR              KV store shared by sims in store mode (default /tmp/xpyd-sim-store)\n"
          "  --store-wait-ms N            decode polls the store this long, then recomputes (default 10000)\n"
          "  --handoff-timeout-ms N       decode gives up a KV pull / bootstrap rendezvous after this (default 10000)\n"
          "  --kv-lease-ms N              a prefill holds unpulled KV this long, then it is stranded (default 30000)\n"
          "  --kv-bytes-per-token N       simulated KV size per prompt token (default 64)\n"
          "  --bootstrap-port N           extra listener serving only KV pulls (default: the HTTP port)\n"
          "  --fail-rate P                answer 500 to this fraction of generate requests (default 0)\n"
          "  --status-code C              answer every generate request with status C (default off)\n"
          "  --fail-after-tokens N        close the connection after N generated tokens (default off)\n"
          "  --stall-ms N                 hold each generate request N ms before doing anything (default 0)\n"
          "  --startup-delay-ms N         wait N ms before listening (default 0)\n"
          "  --eos-prob P                 chance per token of an early EOS unless ignore_eos (default 0: never)\n"
          "  --max-body-bytes N           largest request body accepted (default 16777216)\n"
          "  --log-level error|warn|info|debug   (default info)\n"
          "  -h, --help                   this text\n"
          "  --version                    version and git revision\n",
          f);
}

enum {
    O_ROLE = 1000, O_HOST, O_PORT, O_MODEL, O_MML, O_SEED, O_DP, O_DPMODE, O_PUS, O_DUS, O_BATCH, O_HANDOFF,
    O_STORE, O_STOREWAIT, O_HTO, O_LEASE, O_KVB, O_BPORT, O_FRATE, O_STATUS, O_FAT, O_STALL, O_STARTUP, O_EOS,
    O_MAXBODY, O_LOG, O_PORTFILE, O_KVCAP, O_KVNS
};

static int set_long(const char *name, const char *v, long lo, long hi, long *out)
{
    if (xpyd_parse_long(v, lo, hi, out) != 0) {
        fprintf(stderr, "xpyd_sim: --%s needs an integer in [%ld, %ld], got '%s'\n", name, lo, hi, v);
        return -1;
    }
    return 0;
}

static int parse_args(int argc, char **argv, struct sim_config *c)
{
    static const struct option opts[] = {
        {"role", 1, 0, O_ROLE}, {"host", 1, 0, O_HOST}, {"port", 1, 0, O_PORT}, {"model", 1, 0, O_MODEL},
        {"max-model-len", 1, 0, O_MML}, {"seed", 1, 0, O_SEED}, {"dp-size", 1, 0, O_DP},
        {"dp-mode", 1, 0, O_DPMODE}, {"prefill-us-per-token", 1, 0, O_PUS}, {"decode-us-per-token", 1, 0, O_DUS},
        {"max-batch", 1, 0, O_BATCH}, {"handoff", 1, 0, O_HANDOFF}, {"store-dir", 1, 0, O_STORE},
        {"store-wait-ms", 1, 0, O_STOREWAIT}, {"handoff-timeout-ms", 1, 0, O_HTO}, {"kv-lease-ms", 1, 0, O_LEASE},
        {"kv-bytes-per-token", 1, 0, O_KVB}, {"bootstrap-port", 1, 0, O_BPORT}, {"fail-rate", 1, 0, O_FRATE},
        {"status-code", 1, 0, O_STATUS}, {"fail-after-tokens", 1, 0, O_FAT}, {"stall-ms", 1, 0, O_STALL},
        {"startup-delay-ms", 1, 0, O_STARTUP}, {"eos-prob", 1, 0, O_EOS}, {"max-body-bytes", 1, 0, O_MAXBODY},
        {"log-level", 1, 0, O_LOG}, {"port-file", 1, 0, O_PORTFILE}, {"kv-capacity-tokens", 1, 0, O_KVCAP},
        {"decode-ns-per-kv-token", 1, 0, O_KVNS}, {"help", 0, 0, 'h'}, {"version", 0, 0, 'V'}, {0, 0, 0, 0}};
    int o;
    long v;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *a = optarg;
        int bad = 0;
        switch (o) {
        case O_ROLE:
            if (!strcmp(a, "prefill")) c->role = SIM_ROLE_PREFILL;
            else if (!strcmp(a, "decode")) c->role = SIM_ROLE_DECODE;
            else if (!strcmp(a, "both")) c->role = SIM_ROLE_BOTH;
            else bad = 1;
            break;
        case O_HOST: snprintf(c->host, sizeof c->host, "%s", a); break;
        case O_PORT: bad = set_long("port", a, 0, 65535, &v); c->port = (int)v; break;
        case O_MODEL: snprintf(c->model, sizeof c->model, "%s", a); break;
        case O_MML: bad = set_long("max-model-len", a, 1, 1L << 30, &c->max_model_len); break;
        case O_SEED: bad = set_long("seed", a, 0, 0x7fffffffffffffffL, &v); c->seed = (uint64_t)v; break;
        case O_DP: bad = set_long("dp-size", a, 1, 1024, &v); c->dp_size = (int)v; break;
        case O_DPMODE:
            if (!strcmp(a, "internal")) c->dp_internal = 1;
            else if (!strcmp(a, "external")) c->dp_internal = 0;
            else bad = 1;
            break;
        case O_PUS: bad = set_long("prefill-us-per-token", a, 0, 10000000, &c->prefill_us_per_token); break;
        case O_DUS: bad = set_long("decode-us-per-token", a, 0, 10000000, &c->decode_us_per_token); break;
        case O_BATCH: bad = set_long("max-batch", a, 1, 1000000, &c->max_batch); break;
        case O_HANDOFF:
            if (!strcmp(a, "kv-params")) c->handoff = SIM_HANDOFF_KV_PARAMS;
            else if (!strcmp(a, "store")) c->handoff = SIM_HANDOFF_STORE;
            else if (!strcmp(a, "bootstrap")) c->handoff = SIM_HANDOFF_BOOTSTRAP;
            else if (!strcmp(a, "none")) c->handoff = SIM_HANDOFF_NONE;
            else if (!strcmp(a, "xpyd")) c->handoff = SIM_HANDOFF_XPYD;
            else bad = 1;
            break;
        case O_STORE: snprintf(c->store_dir, sizeof c->store_dir, "%s", a); break;
        case O_STOREWAIT: bad = set_long("store-wait-ms", a, 0, 3600000, &c->store_wait_ms); break;
        case O_HTO: bad = set_long("handoff-timeout-ms", a, 1, 3600000, &c->handoff_timeout_ms); break;
        case O_LEASE: bad = set_long("kv-lease-ms", a, 1, 3600000, &c->lease_ms); break;
        case O_KVB: bad = set_long("kv-bytes-per-token", a, 1, 1 << 20, &c->kv_bytes_per_token); break;
        case O_BPORT: bad = set_long("bootstrap-port", a, 1, 65535, &v); c->bootstrap_port = (int)v; break;
        case O_FRATE: bad = xpyd_parse_double(a, 0, 1, &c->fail_rate) != 0; break;
        case O_STATUS: bad = set_long("status-code", a, 100, 599, &v); c->status_code = (int)v; break;
        case O_FAT: bad = set_long("fail-after-tokens", a, 0, 1L << 30, &c->fail_after_tokens); break;
        case O_STALL: bad = set_long("stall-ms", a, 0, 3600000, &c->stall_ms); break;
        case O_STARTUP: bad = set_long("startup-delay-ms", a, 0, 600000, &c->startup_delay_ms); break;
        case O_EOS: bad = xpyd_parse_double(a, 0, 1, &c->eos_prob) != 0; break;
        case O_MAXBODY: bad = set_long("max-body-bytes", a, 1024, 1L << 30, &c->max_body_bytes); break;
        case O_KVCAP: bad = set_long("kv-capacity-tokens", a, 0, 1L << 40, &c->kv_capacity_tokens); break;
        case O_KVNS: bad = set_long("decode-ns-per-kv-token", a, 0, 1000000, &c->decode_ns_per_kv_token); break;
        case O_PORTFILE: snprintf(c->port_file, sizeof c->port_file, "%s", a); break;
        case O_LOG: c->log_level = xpyd_log_level_parse(a); bad = c->log_level < 0; break;
        case 'h': usage(stdout); exit(0);
        case 'V': xpyd_print_version("xpyd_sim"); exit(0);
        default: usage(stderr); return -1;
        }
        if (bad) {
            fprintf(stderr, "xpyd_sim: invalid value '%s' for option\n", a ? a : "");
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "xpyd_sim: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (c->port == 0 && !c->dp_internal && c->dp_size > 1) {
        fprintf(stderr, "xpyd_sim: --port 0 needs --dp-size 1 or --dp-mode internal\n");
        return -1;
    }
    if (!c->dp_internal && c->port + c->dp_size - 1 > 65535) {
        fprintf(stderr, "xpyd_sim: port + dp-size - 1 exceeds 65535\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct sim_config c;
    sim_config_defaults(&c);
    if (parse_args(argc, argv, &c) != 0)
        return 2;
    return sim_run(&c);
}
