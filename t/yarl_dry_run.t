#!/usr/bin/perl

# yarl_dry_run on: decide and log at yarl_log_level, never reject; $yarl_status says
# REJECTED_DRY_RUN and the refused requests are not counted.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('d', 0.01, 2, 2);
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    log_format yarl '$status $yarl_status $yarl_quota';
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        add_header X-Yarl-Status $yarl_status always;
        yarl_dry_run on;
        yarl_log_level warn;
        location /acct/ {
            alias %%TESTDIR%%/;
            access_log %%TESTDIR%%/yarl.log yarl;
            yarl_account d;
        }
        location /real/ {
            alias %%TESTDIR%%/;
            yarl_dry_run off;
            yarl_log_level info;
            yarl_check d;
        }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'd', 5), 'quota arrived');

my @r = map { http_get($p, '/acct/index.html') } 1 .. 8;
is_deeply([map { status_of($_) } @r], [(200) x 8], 'dry run never rejects');
is_deeply([map { header_of($_, 'X-Yarl-Status') } @r],
	[('PASSED') x 3, ('REJECTED_DRY_RUN') x 5], '$yarl_status REJECTED_DRY_RUN over the quota');
is($t->stats($p, '/stats?quota=d')->{quota}{fill} >= 2.99 ? 3 : -1, 3,
	'dry-run rejections were not counted');
is($t->stats($p)->{requests}{rejected_dry_run}, 5, 'stats count dry-run rejections');

is(status_of(http_get($p, '/real/index.html')), 429, 'dry_run off in a location rejects');

$t->finish();
my $log = $t->read_file('error.log');
my @lines = $log =~ /^(.*limiting requests by quota "d".*)$/mg;
is(scalar(grep { /\[warn\] .*limiting requests by quota "d", fill 3\.000, dry run, client/ } @lines), 5,
	'dry-run rejections logged at warn with ", dry run"');
is(scalar(grep { /\[info\]/ } @lines), 0, 'info-level rejection line below error_log level');
like($t->read_file('yarl.log'), qr/^200 REJECTED_DRY_RUN d$/m, 'access log: REJECTED_DRY_RUN');
done_testing();
