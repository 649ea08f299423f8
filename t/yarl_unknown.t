#!/usr/bin/perl

# Without any quota (no roots at all), every rule passes as UNLIMITED; variables, rule
# inheritance, internal redirects (decided once) and the yarl_stats page.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of body_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF', workers => 1);
    log_format yarl '$uri $status $yarl_status "$yarl_quota"';
    error_log %%TESTDIR%%/info.log info;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        access_log %%TESTDIR%%/yarl.log yarl;
        add_header X-Yarl-Status "[$yarl_status]" always;
        yarl_check server_level;

        location /check/ {
            alias %%TESTDIR%%/;
            yarl_check nosuch;
            yarl_check "s3_${arg_bucket}_read";
        }
        location /account/ {
            alias %%TESTDIR%%/;
            yarl_account "u_$arg_u" $arg_w;
        }
        location /inherit/ {
            alias %%TESTDIR%%/;
        }
        location /redirect/ {
            alias %%TESTDIR%%/;
            yarl_account first;
            error_page 404 = /fallback/index.html;
        }
        location /fallback/ {
            alias %%TESTDIR%%/;
            yarl_account second;
        }
    }
    server {
        listen 127.0.0.1:%%PORT_8081%%;
        root %%TESTDIR%%;
        add_header X-Yarl-Status "[$yarl_status]" always;
        # No rules here, so reading the page does not count itself.
        location = /stats {
            yarl_stats;
        }
    }
EOF
$t->run();

my $r = http_get($t->port(8080), '/check/index.html?bucket=b1');
is(status_of($r), 200, 'unknown quota passes');
is(header_of($r, 'X-Yarl-Status'), '[UNLIMITED]', '$yarl_status UNLIMITED');
is(body_of($r), "hello\n", 'file served');

$r = http_get($t->port(8080), '/inherit/index.html');
is(status_of($r), 200, 'inherited server-level rule passes');
is(header_of($r, 'X-Yarl-Status'), '[UNLIMITED]', 'server-level rule inherited');

$r = http_get($t->port(8081), '/index.html');
is(header_of($r, 'X-Yarl-Status'), '[]', 'no rules: $yarl_status not set');

$r = http_get($t->port(8080), '/account/index.html?u=x&w=abc');
is(status_of($r), 200, 'non-numeric weight passes');
$r = http_get($t->port(8080), '/account/index.html?u=x&w=5');
is(status_of($r), 200, 'numeric weight passes');

my $before = $t->stats($t->port(8081));
ok($before, 'stats is JSON');
$r = http_get($t->port(8080), '/redirect/missing.html');
is(status_of($r), 200, 'error_page redirect served');
my $after = $t->stats($t->port(8081));
is($after->{requests}{checked} - $before->{requests}{checked}, 1,
	'internal redirect decided once');

my $s = $t->stats($t->port(8081));
like($s->{pid}, qr/^\d+$/, 'stats: pid');
is_deeply($s->{roots}, [], 'stats: no roots');
is($s->{quotas}, 0, 'stats: no quotas');
is($s->{sync_running}, JSON::PP::true, 'stats: sync thread runs without roots');
is($s->{sync}{interval_ms}, 1000, 'stats: default interval');
is($s->{sync}{timeout_ms}, 500, 'stats: default timeout');
ok($s->{requests}{unlimited} >= 5, 'stats: unlimited requests counted');
is($s->{requests}{rejected}, 0, 'stats: nothing rejected');

$r = http_get($t->port(8081), '/stats?quota=nosuch');
like(header_of($r, 'Content-Type'), qr{^application/json}, 'stats content type');
like(body_of($r), qr/"quota":null/, 'stats: unknown quota is null');

$t->finish();

my $log = $t->read_file('yarl.log');
like($log, qr{^/check/index\.html 200 UNLIMITED "-"$}m, 'access log: $yarl_status');
like($log, qr{^/fallback/index\.html 200 UNLIMITED}m, 'access log after redirect keeps the decision');
like($t->read_file('info.log'), qr/\[info\] .*weight "abc" for quota "u_x" is not a number/,
	'bad weight logged at info, as nginx logs a client\'s errors');

done_testing();
