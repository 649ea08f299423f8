#!/usr/bin/perl

# yarl_status: 429 by default, any 400-599 code per level, inherited like limit_req_status.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('full', 0.001, 0, 0);
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location /fill/ { alias %%TESTDIR%%/; yarl_account full; }
        location /default/ { alias %%TESTDIR%%/; yarl_check full; }
        location /s503/ { alias %%TESTDIR%%/; yarl_check full; yarl_status 503; }
        location = /stats { yarl_stats; }
    }
    server {
        listen 127.0.0.1:%%PORT_8081%%;
        root %%TESTDIR%%;
        yarl_status 599;
        yarl_check full;
        location /inherit/ { alias %%TESTDIR%%/; }
        location /override/ { alias %%TESTDIR%%/; yarl_status 403; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'full', 5), 'quota arrived');
is(status_of(http_get($p, '/default/index.html')), 200, 'empty bucket passes');
is(status_of(http_get($p, '/fill/index.html')), 200, 'first account passes at F=low');
is(status_of(http_get($p, '/default/index.html')), 429, 'default status 429');
is(status_of(http_get($p, '/s503/index.html')), 503, 'yarl_status 503');
is(status_of(http_get($t->port(8081), '/inherit/index.html')), 599, 'server-level status inherited');
is(status_of(http_get($t->port(8081), '/override/index.html')), 403, 'location overrides');
$t->finish();
done_testing();
