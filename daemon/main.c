/* main.c — the command line and the config file (config.c), then daemon_run(). */
#include <stdio.h>

#include "base/config.h"
#include "daemon.h"
#include "net/tls.h"

int main(int argc, char **argv)
{
	struct daemon_config cfg;
	struct config_src *src;
	struct tls_ident *id = NULL;
	char err[512];
	int r;

	r = config_parse_args(argc, argv, &src);
	if (r != 0)
		return r > 0 ? 0 : -r;
	r = config_build(src, &cfg, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "<3>zerod: refusing to start: %s\n", err);
		config_src_free(src);
		return CONFIG_EXIT_CONFIG;
	}
	/* key files it refuses are a config it refuses (exit 78: systemd does
	 * not restart it); daemon_run() reads them again, before serving */
	r = tls_ident_load(cfg.tls_key, cfg.tls_cert, cfg.tls_peers, cfg.tls_ca, &id, err,
			   sizeof(err));
	tls_ident_free(id);
	if (r < 0) {
		fprintf(stderr, "<3>zerod: refusing to start: %s\n", err);
		config_src_free(src);
		return CONFIG_EXIT_CONFIG;
	}
	if (!cfg.socket_path[0]) {
		fprintf(stderr, "zerod: no socket path: pass --socket, or set ZEROD_SOCKET or "
				"RUNTIME_DIRECTORY\n");
		config_src_free(src);
		return CONFIG_EXIT_USAGE;
	}
	r = daemon_run(&cfg);
	config_src_free(src);
	return r < 0 ? 1 : 0;
}
