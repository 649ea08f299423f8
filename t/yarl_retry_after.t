#!/usr/bin/perl

# Retry-After on rejections: whole seconds until the rejecting quota drains to low_burst,
# stable between consecutive requests; yarl_retry_after off removes it.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);

my $t = Test::Yarl->new();
$t->run_root('A');
$t->put_quota('r', 2, 10, 10);
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF2', workers => 1);
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location /fill/ { alias %%TESTDIR%%/; yarl_account r $arg_w; }
        location /chk/ { alias %%TESTDIR%%/; yarl_check r; }
        location /off/ { alias %%TESTDIR%%/; yarl_check r; yarl_retry_after off; }
        location = /stats { yarl_stats; }
    }
EOF2
$t->run();
my $p = $t->port(8080);
ok($t->wait_quota($p, 'r', 5), 'quota arrived');

my $r = http_get($p, '/chk/index.html');
is(header_of($r, 'Retry-After'), undef, 'no Retry-After on a pass');

# F: 0 -> 30; (30 - 10) / 2 units/s = 10 s to drain to low_burst.
is(status_of(http_get($p, '/fill/index.html?w=30')), 200, 'filled to 30');
my @v;
for (1 .. 10) {
	$r = http_get($p, '/chk/index.html');
	is(status_of($r), 429, "rejected $_") if $_ == 1;
	push @v, header_of($r, 'Retry-After');
}
ok(!grep({ !defined || !/^\d+$/ } @v), 'Retry-After is whole seconds: ' . join(',', map { $_ // 'undef' } @v));
ok(!grep({ $_ < 8 || $_ > 10 } @v), 'about 10 s');
my ($min, $max) = (sort { $a <=> $b } @v)[0, -1];
ok($max - $min <= 1, 'consecutive values do not wobble');
ok(!grep({ $v[$_] > $v[$_ - 1] } 1 .. $#v), 'never increases between requests');

$r = http_get($p, '/off/index.html');
is(status_of($r), 429, 'still rejected with yarl_retry_after off');
is(header_of($r, 'Retry-After'), undef, 'no Retry-After when off');

$t->finish();
done_testing();
