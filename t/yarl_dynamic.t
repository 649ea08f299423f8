#!/usr/bin/perl

# Quotas created, changed and deleted through the root's admin API take effect in a
# running nginx within 3 s, without a reload.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);
use Time::HiRes qw(time);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        add_header X-Yarl-Status $yarl_status always;
        location /chk/ { alias %%TESTDIR%%/; yarl_check dyn; }
        location /fill/ { alias %%TESTDIR%%/; yarl_account dyn $arg_w; }
    }
EOF2
$t->run();
my $p = $t->port(8080);

sub yarl_status { header_of(http_get($p, '/chk/index.html'), 'X-Yarl-Status') // '' }

is(yarl_status(), 'UNLIMITED', 'before: no quota');

my $start = time();
$t->put_quota('dyn', 0.001, 5, 5);
ok($t->wait_for(sub { yarl_status() eq 'PASSED' }, 3), 'created quota applies within 3 s');
diag(sprintf 'created -> applied in %.2f s', time() - $start);

is(status_of(http_get($p, '/fill/index.html?w=20')), 200, 'filled to 20');
is(status_of(http_get($p, '/chk/index.html')), 429, 'over high_burst: rejected');

$start = time();
$t->put_quota('dyn', 0.001, 100, 100);
ok($t->wait_for(sub { status_of(http_get($p, '/chk/index.html')) == 200 }, 3),
	'raised bursts apply within 3 s');
diag(sprintf 'changed -> applied in %.2f s', time() - $start);

$t->put_quota('dyn', 0.001, 1, 1);
ok($t->wait_for(sub { status_of(http_get($p, '/chk/index.html')) == 429 }, 3),
	'lowered bursts apply within 3 s');

$start = time();
$t->delete_quota('dyn');
ok($t->wait_for(sub { yarl_status() eq 'UNLIMITED' }, 3), 'deleted quota stops limiting within 3 s');
diag(sprintf 'deleted -> applied in %.2f s', time() - $start);
is(status_of(http_get($p, '/chk/index.html')), 200, 'passes after the delete');

$t->finish();
done_testing();
