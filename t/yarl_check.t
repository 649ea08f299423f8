#!/usr/bin/perl

# yarl_check counts nothing and rejects once the quota's counter, raised by yarl_account
# traffic in this nginx or in another limiter synced through the root, is over high_burst.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of body_of);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('c', 0.01, 10, 10);
$t->put_quota('other', 0.01, 10, 10);
# A name with a byte outside the charset, written with %XX as the admin API writes it.
my ($st) = $t->admin('PUT', '/v1/quotas/sp%2520ace', { limit => 0.01, low_burst => 0, high_burst => 0 });
is($st, 200, 'quota "sp%20ace" created');

my $http = <<'EOF2';
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        add_header X-Yarl-Status $yarl_status always;
        add_header X-Yarl-Quota $yarl_quota always;
        location /chk/ { alias %%TESTDIR%%/; yarl_check $arg_q; }
        location /acct/ { alias %%TESTDIR%%/; yarl_account $arg_q; }
        location /const/ { alias %%TESTDIR%%/; yarl_account "sp%20ace"; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->write_file('index.html', "hello\n");
$t->write_http_conf($http, workers => 1);
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'c', 5), 'quota arrived from the root');

my @s = map { status_of(http_get($p, '/chk/index.html?q=c')) } 1 .. 30;
is_deeply(\@s, [(200) x 30], 'check-only never fills the bucket');
is($t->stats($p, '/stats?quota=c')->{quota}{fill}, 0, 'fill still 0 after checks');
my $bad = http_get($p, '/stats?quota=c%ZZ');
like($bad, qr/ 400 /, 'yarl_stats: a malformed escape in ?quota= is refused');
like(body_of($bad), qr/^\{"error":"quota: a %XX escape is malformed"\}$/m, 'naming the argument');

my $r = http_get($p, '/chk/index.html?q=c');
is(header_of($r, 'X-Yarl-Status'), 'PASSED', '$yarl_status PASSED');
is(header_of($r, 'X-Yarl-Quota'), 'c', '$yarl_quota names the matched quota');

@s = map { status_of(http_get($p, '/acct/index.html?q=c')) } 1 .. 12;
is_deeply([@s[0 .. 10]], [(200) x 11], 'account passes up to high_burst');
is($s[11], 429, 'account rejects over high_burst');

$r = http_get($p, '/chk/index.html?q=c');
is(status_of($r), 429, 'check rejects once the counter is over high_burst');
is(header_of($r, 'X-Yarl-Status'), 'REJECTED', '$yarl_status REJECTED');
is(header_of($r, 'X-Yarl-Quota'), 'c', '$yarl_quota names the rejecting quota');

# A constant name written with %XX names the quota of those bytes.
ok($t->wait_quota($p, 'sp%20ace', 5), 'the escaped quota arrived');
$r = http_get($p, '/const/index.html');
is(status_of($r) . ' ' . header_of($r, 'X-Yarl-Quota'), '200 sp%20ace', 'yarl_account "sp%20ace" counts on it');
is(status_of(http_get($p, '/const/index.html')), 429, 'and is limited by it');

# Another limiter (a second nginx) accounts on "other"; this one only checks it.
my $t2 = Test::Yarl->new();
my $root = $t->root_url('A');
(my $http2 = $http) =~ s/%%ROOT_A%%/$root/;
$t2->write_file('index.html', "hello\n");
$t2->write_http_conf($http2, workers => 1);
$t2->run();
my $p2 = $t2->port(8080);
ok($t2->wait_quota($p2, 'other', 5), 'second limiter has the quota');
is(status_of(http_get($p, '/chk/index.html?q=other')), 200, 'other passes before');
my @s2 = map { status_of(http_get($p2, '/acct/index.html?q=other')) } 1 .. 15;
is(scalar(grep { $_ == 200 } @s2), 11, 'second limiter accounted up to high_burst');
ok($t->wait_for(sub { status_of(http_get($p, '/chk/index.html?q=other')) == 429 }, 3),
	'check rejects on a counter raised by another limiter, within 3 s');

$t2->finish();
$t->finish();
done_testing();
